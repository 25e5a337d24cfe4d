"""Embedded corpora: present, deterministic, split by document without overlap."""
import pytest

from dmtp.data import corpora
from dmtp.data.mathgen import make_problem


@pytest.mark.parametrize("domain", corpora.DOMAINS)
def test_splits_are_disjoint_and_nonempty(domain):
    names = {s: {d.name for d in corpora.documents(domain, s)} for s in corpora.SPLITS}
    assert all(names[s] for s in corpora.SPLITS)
    assert not names["train"] & names["validation"] and not names["train"] & names["test"]
    assert not names["validation"] & names["test"]
    texts = {s: {d.text for d in corpora.documents(domain, s)} for s in corpora.SPLITS}
    assert not texts["train"] & texts["test"]


def test_code_is_stdlib_source_without_tests():
    docs = corpora.documents("code", "train")
    assert any(d.name.endswith("/json/decoder.py") or d.name == "code:json/decoder.py" for d in docs)
    assert not any("/test/" in d.name or "/tests/" in d.name or "site-packages" in d.name for d in docs)


def test_prose_has_pydoc_topics_and_docstrings():
    names = [d.name for s in corpora.SPLITS for d in corpora.documents("prose", s)]
    assert any(n.startswith("prose:topic:") for n in names) and any(n.startswith("prose:module:") for n in names)


def test_math_is_deterministic_and_worked():
    assert make_problem(1234, 7) == make_problem(1234, 7) != make_problem(1234, 8)
    p = make_problem(1234, 7)
    answer = int(p.rsplit("The answer is ", 1)[1].rstrip(".\n"))
    last_equation = p.split("Answer: ")[1].split(", so")[-2].rsplit(" = ", 1)[1]
    assert int(last_equation) == answer


def test_unknown_domain_or_split():
    with pytest.raises(ValueError, match="unknown corpus domain"):
        corpora.documents("poetry", "train")
    with pytest.raises(ValueError, match="unknown split"):
        corpora.documents("code", "dev")
