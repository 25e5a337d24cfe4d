"""The target writes its own training data through the one decoding loop (dmtp.data.regenerate):
greedy responses equal the target's own greedy decoding, sampled ones are reproducible from a seed,
the cache is keyed by everything that changes the output, and a killed run resumes without redoing
finished shards."""
import json

import pytest
import torch

from dmtp.configs import compose_train
from dmtp.data import regenerate as regen_mod
from dmtp.data.regenerate import RegenSettings, cache_dir_for, regenerate
from dmtp.training.job import train

NEW = 12


@pytest.fixture(scope="module")
def prompts(micro_target):
    gen = torch.Generator().manual_seed(7)
    vocab = micro_target.config.vocab_size
    return [torch.randint(5, vocab, (n,), generator=gen).tolist() for n in (5, 9, 7, 12, 6, 8, 10)]


def _hf_greedy(target, prompt, n, eos):
    ids = torch.tensor([prompt])
    out = target.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)
    row = out[0, len(prompt):].tolist()
    return row[:row.index(eos) + 1] if eos in row else row


def test_greedy_regeneration_is_the_targets_greedy_decoding(micro_target, prompts, tmp_path):
    eos = micro_target.config.eos_token_id
    settings = RegenSettings(new_tokens=NEW, batch_size=3, shard_size=4)
    outs = regenerate(micro_target, prompts, settings, cache_root=tmp_path, progress=False)
    assert outs == [_hf_greedy(micro_target, p, NEW, eos) for p in prompts]
    # Read back from the cache: no decoder is built at all.
    again = regenerate(micro_target, prompts, settings, cache_root=tmp_path, progress=False,
                       on_shard=lambda i: pytest.fail("a cached shard was decoded again"))
    assert again == outs


def test_sampled_regeneration_is_reproducible_from_its_seed(micro_target, prompts, tmp_path):
    def run(seed, root):
        settings = RegenSettings(new_tokens=NEW, temperature=1.0, top_k=20, seed=seed, batch_size=4, shard_size=4)
        return regenerate(micro_target, prompts, settings, cache_root=root, progress=False)

    first = run(3, tmp_path / "a")
    assert run(3, tmp_path / "b") == first          # fresh cache, same seed: the same samples
    assert run(4, tmp_path / "c") != first          # another seed: other samples
    greedy = regenerate(micro_target, prompts, RegenSettings(new_tokens=NEW), cache_root=tmp_path / "g",
                        progress=False)
    assert first != greedy


def test_cache_is_keyed_by_target_prompts_and_settings(micro_target, prompts, tmp_path):
    base = RegenSettings(new_tokens=NEW)
    key = cache_dir_for(micro_target, prompts, base, [0], tmp_path)
    assert cache_dir_for(micro_target, prompts, RegenSettings(new_tokens=NEW, batch_size=5), [0], tmp_path) == key
    assert cache_dir_for(micro_target, prompts, RegenSettings(new_tokens=NEW + 1), [0], tmp_path) != key
    assert cache_dir_for(micro_target, prompts, RegenSettings(new_tokens=NEW, temperature=0.7), [0], tmp_path) != key
    assert cache_dir_for(micro_target, prompts[:-1], base, [0], tmp_path) != key
    assert cache_dir_for(micro_target, prompts, base, [1], tmp_path) != key

    class Other:
        path = str(tmp_path)
        config = micro_target.config

    assert cache_dir_for(Other(), prompts, base, [0], tmp_path) != key


def test_killed_regeneration_resumes_without_redoing_finished_shards(micro_target, prompts, tmp_path, monkeypatch):
    settings = RegenSettings(new_tokens=NEW, temperature=0.8, seed=11, batch_size=2, shard_size=2)
    whole = regenerate(micro_target, prompts, settings, cache_root=tmp_path / "whole", progress=False)

    class Killed(Exception):
        pass

    def kill_after_second(index):
        if index == 1:
            raise Killed

    with pytest.raises(Killed):
        regenerate(micro_target, prompts, settings, cache_root=tmp_path / "cut", progress=False,
                   on_shard=kill_after_second)
    decoded = []
    resumed = regenerate(micro_target, prompts, settings, cache_root=tmp_path / "cut", progress=False,
                         on_shard=decoded.append)
    assert decoded == [2, 3]                          # shards 0 and 1 were read back, not decoded
    assert resumed == whole                           # and the samples are those of an uninterrupted run


@pytest.mark.parametrize("bad,match", [(dict(new_tokens=0), "new_tokens"), (dict(new_tokens=4, temperature=-1),
                                                                            "temperature"),
                                       (dict(new_tokens=4, method="beam"), "method")])
def test_bad_settings_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match) as err:
        RegenSettings(**bad)
    assert "\n" not in str(err.value)


def test_training_on_regenerated_data(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(regen_mod, "dmtp_home", lambda: tmp_path / "home")
    summary = train(compose_train(["data=regenerated", "data.regen_sequences=8", "data.regen_temperature=0.8"],
                                  output_dir=tmp_path / "run"))
    assert summary["global_step"] == 4
    # The run ends with the per-domain walk table, then the command that decodes with the drafter.
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"[dmtp] decode with it: python -m dmtp.infer drafter={summary['drafter']}"
    header = next(i for i, line in enumerate(lines) if line.startswith("domain "))
    assert lines[header - 1].startswith("final validation walk, dual_anchor_zero_init at step 4")
    assert [line.split()[0] for line in lines[header + 2:-1]] == ["code", "math", "prose"]
    assert "mtp415 tau" in lines[header] and "mtp415: the target's MTP chained alone" in lines[header - 1]
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert all(1.0 <= record[f"walk/{d}/mtp415_tau"] <= 5.0 for d in ("code", "math", "prose"))
    shards = list((tmp_path / "home" / "cache").glob("regen-*/shard-*.safetensors"))
    assert shards, "the regenerated data were not cached"


def test_engine_in_the_cache_key_only_when_sampling():
    """Greedy tokens are the same from dmtp and vLLM (tests/vllm_interop), so one cache serves both."""
    greedy = [RegenSettings(new_tokens=8, engine=e).output_key() for e in ("dmtp", "vllm")]
    sampled = [RegenSettings(new_tokens=8, temperature=1.0, engine=e).output_key() for e in ("dmtp", "vllm")]
    assert greedy[0] == greedy[1] and sampled[0] != sampled[1]
    assert "engine" not in sampled[0]                  # dmtp's keys are those written before engines existed
    with pytest.raises(ValueError, match="regeneration engine must be one of dmtp, vllm"):
        RegenSettings(new_tokens=8, engine="sglang")
