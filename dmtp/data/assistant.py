"""The assistant corpus: requests and the responses a served model gives them, in three domains.

- code:  a generated Python function stub (signature and docstring), answered by its body (`programs`);
- prose: "Explain what this function does." over a generated function, answered in a few sentences that say
         what it takes, what it returns and how (held out of the default drafter data, as prose is);
- math:  a generated word problem, answered by its worked solution (`mathgen`).

Each document is a request and its response (`Exchange`); the response follows from the request, as an
assistant's answer does, so a small model can write it the way served chat models write theirs: confident
where the answer is determined, free where it is not (a name, a phrasing, a loop or a comprehension).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from dmtp.data.mathgen import make_problem
from dmtp.data.programs import Task, make_task

EXPLAIN_REQUEST = "Explain what this function does.\n\n"
_ANSWER = "\nAnswer:"


@dataclass(frozen=True)
class Exchange:
    request: str
    response: str


def code_exchange(seed: int, index: int) -> Exchange:
    task = make_task(seed, index)
    return Exchange(task.prompt, task.response)


def math_exchange(seed: int, index: int) -> Exchange:
    text = make_problem(seed, index)
    cut = text.index(_ANSWER) + len(_ANSWER)
    return Exchange(text[:cut], text[cut:])


def prose_exchange(seed: int, index: int) -> Exchange:
    task = make_task(seed + 7919, index)   # other functions than the code domain's of the same index
    rng = random.Random(f"dmtp-explain-{seed}-{index}")
    return Exchange(EXPLAIN_REQUEST + task.prompt + task.response + "\n", explain(task, rng))


_TYPE_WORDS = {"list": "a list", "str": "a string", "int": "a whole number", "dict": "a dictionary",
               "float": "a number", "bool": "True or False"}
_SIGNATURE = re.compile(r"def (\w+)\((.*)\) -> (\w+):")
_DOC = re.compile(r'"""(.*?)\n', re.S)


def explain(task: Task, rng: random.Random) -> str:
    """A few sentences on what the function takes, what it returns and how its body gets there."""
    name, args, returns = _SIGNATURE.match(task.prompt).groups()
    params = [a.split(": ") for a in args.split(", ")]
    doc = _DOC.search(task.prompt).group(1).strip()
    sentences = [f"The function {name} takes {_describe_args(params, rng)}."]
    sentences.append(f"It {_third_person(doc)}")
    sentences.append(_how(task.response, rng))
    if returns in _TYPE_WORDS and returns != "bool":
        sentences.append(rng.choice([f"The result is {_TYPE_WORDS[returns]}.", f"It gives back {_TYPE_WORDS[returns]}."]))
    return " ".join(sentences) + "\n"


def _describe_args(params: list[list[str]], rng: random.Random) -> str:
    parts = [f"{p}, {_TYPE_WORDS.get(t, 'a value')}" for p, t in params]
    if len(parts) == 1:
        return rng.choice(["one argument, ", "a single argument, "]) + parts[0]
    return f"{len(parts)} arguments: " + ", ".join(parts[:-1]) + " and " + parts[-1]


def _third_person(doc: str) -> str:
    """'Return the sum ...' -> 'returns the sum ...'; 'Map each ...' -> 'maps each ...'."""
    verb, _, rest = doc.partition(" ")
    verb = verb.lower()
    verb = verb + ("es" if verb.endswith(("s", "sh", "ch", "x")) else "s")
    return f"{verb} {rest}"


def _how(body: str, rng: random.Random) -> str:
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    if len(lines) == 1:
        if "for " in lines[0]:
            return rng.choice(["It does this in a single expression, with a comprehension.",
                               "The whole work is one comprehension in the return statement."])
        return rng.choice(["It does this in a single return statement.", "The body is one return statement."])
    if any(line.startswith("while ") for line in lines):
        return rng.choice(["It repeats a while loop until the condition no longer holds.",
                           "A while loop does the work, one step at a time."])
    if any(line.startswith("return True") or line.startswith("return False") for line in lines[:-1]) or \
            sum(line.startswith("return") for line in lines) > 1:
        return rng.choice(["It returns as soon as the answer is known.",
                           "It stops early, as soon as it can return."])
    if any(".append(" in line for line in lines):
        return rng.choice(["It builds a new list inside a loop and returns it.",
                           "A loop appends each result to a new list."])
    if any("+= " in line or "*= " in line for line in lines):
        return rng.choice(["It keeps a running value, updated inside a loop.",
                           "A loop updates one variable, which is returned at the end."])
    return rng.choice(["It works through the input step by step.", "It does this in a few simple steps."])


EXCHANGES = {"code": code_exchange, "prose": prose_exchange, "math": math_exchange}
