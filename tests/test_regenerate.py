"""The target writes its own training data through the one decoding loop (dmtp.datagen.regenerate):
greedy responses equal the target's own greedy decoding, sampled ones are reproducible from a seed,
the cache is keyed by everything that changes the output, and a killed run resumes without redoing
finished shards."""
import json
import re

import pytest
import torch

from dmtp.configs import compose_train
from dmtp.datagen import regenerate as regen_mod
from dmtp.datagen.regenerate import RegenSettings, cache_dir_for, regenerate
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
    summary = train(compose_train(["data=regenerated", "injection=dual_anchor_zero_init", "recipe=greedy",
                                   "data.regen_sequences=8", "data.regen_temperature=0.8"],
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


def _rewrite(path, change):
    """Rewrite a shard's tensors through `change(tokens, lengths)`, keeping its metadata (a changed file)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, data = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    change(data["tokens"], data["lengths"])
    save_file(data, str(path), metadata=meta)


def _out_of_vocab(vocab):
    def change(tokens, lengths):   # a forged shard whose checksum matches: only the vocabulary bound catches it
        tokens[0, 0] = vocab + 5
    return change


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _garble(path):
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\xff\x00" * 20)


@pytest.mark.parametrize("damage", ["changed token", "changed length", "out-of-vocabulary id", "truncated", "garbled"])
def test_a_damaged_shard_is_named_in_one_line_and_decoded_again(damage, micro_target, prompts, tmp_path, capsys):
    settings = RegenSettings(new_tokens=NEW, batch_size=2, shard_size=2)
    clean = regenerate(micro_target, prompts, settings, cache_root=tmp_path, progress=False)
    shard = cache_dir_for(micro_target, prompts, settings, [micro_target.config.eos_token_id],
                          tmp_path) / "shard-00001.safetensors"
    assert shard.is_file()
    vocab = micro_target.config.vocab_size
    if damage == "changed token":
        _rewrite(shard, lambda tokens, lengths: tokens[0].__setitem__(0, (int(tokens[0, 0]) + 1) % vocab))
    elif damage == "changed length":
        _rewrite(shard, lambda tokens, lengths: lengths.__setitem__(0, int(lengths[0]) - 1))
    elif damage == "out-of-vocabulary id":
        _rewrite(shard, _out_of_vocab(vocab))
        from safetensors.torch import load_file, save_file

        data = load_file(str(shard))
        save_file(data, str(shard), metadata={"format": "pt", "sha256": regen_mod._checksum(data["tokens"],
                                                                                            data["lengths"])})
    else:
        (_truncate if damage == "truncated" else _garble)(shard)
    capsys.readouterr()
    decoded = []
    again = regenerate(micro_target, prompts, settings, cache_root=tmp_path, progress=False, on_shard=decoded.append)
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith(f"[dmtp] regeneration cache: {shard} is damaged ("), lines
    assert lines[0].endswith("); decoding it again")
    assert decoded == [1] and again == clean
    assert regenerate(micro_target, prompts, settings, cache_root=tmp_path, progress=False,
                      on_shard=lambda i: pytest.fail("a repaired shard was decoded again")) == clean


def test_two_runs_started_together_on_one_cache_decode_it_once(micro_target, prompts, tmp_path, monkeypatch, capsys):
    import threading
    import time

    settings = RegenSettings(new_tokens=NEW, batch_size=2, shard_size=2)
    make_writer = regen_mod.make_writer

    class Slow:   # decoding takes a while, as it does on a real target: the two runs overlap
        def __init__(self, *args):
            self.writer = make_writer(*args)

        def generate(self, *args, **kwargs):
            time.sleep(0.3)
            return self.writer.generate(*args, **kwargs)

    monkeypatch.setattr(regen_mod, "make_writer", Slow)
    decoded, results = [], {}
    together = threading.Barrier(2)

    def run(name):
        together.wait()
        results[name] = regenerate(micro_target, prompts, settings, cache_root=tmp_path, progress=False,
                                   on_shard=decoded.append)

    runs = [threading.Thread(target=run, args=(name,)) for name in ("first", "second")]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    assert sorted(decoded) == [0, 1, 2, 3]   # each shard decoded once, by one of the two runs
    assert results["second"] == results["first"] == regenerate(micro_target, prompts, settings,
                                                               cache_root=tmp_path / "alone", progress=False)
    assert re.search(r"waiting for another run \(pid \d+\) that is writing the training data", capsys.readouterr().out)


def test_engine_in_the_cache_key_only_when_sampling():
    """Greedy tokens are the same from dmtp and vLLM (tests/vllm_interop), so one cache serves both."""
    greedy = [RegenSettings(new_tokens=8, engine=e).output_key() for e in ("dmtp", "vllm")]
    sampled = [RegenSettings(new_tokens=8, temperature=1.0, engine=e).output_key() for e in ("dmtp", "vllm")]
    assert greedy[0] == greedy[1] and sampled[0] != sampled[1]
    assert "engine" not in sampled[0]                  # dmtp's keys are those written before engines existed
    with pytest.raises(ValueError, match="regeneration engine must be one of dmtp, vllm"):
        RegenSettings(new_tokens=8, engine="sglang")


def test_a_rank_waiting_for_its_own_runs_other_rank_does_not_call_it_another_run(tmp_path, monkeypatch, capsys):
    """Ranks of one distributed run share its rendezvous (MASTER_ADDR:MASTER_PORT, WORLD_SIZE > 1): a rank that
    waits for the one writing the data says it waits for its own run's rank; a holder of another rendezvous, or
    none, is another run (issue 43)."""
    import os
    import threading

    from dmtp.datagen.regenerate import _waiting_notice
    from dmtp.datagen.shards import shard_lock

    for env in ({"MASTER_PORT": "29555"}, {"MASTER_PORT": "29556"}):
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "29555")
        monkeypatch.setenv("WORLD_SIZE", "2")
        held, release = threading.Event(), threading.Event()

        def hold():
            with shard_lock(tmp_path, 0):
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait(30)
        for key, value in env.items():   # the waiter's own rendezvous
            monkeypatch.setenv(key, value)
        threading.Timer(0.3, release.set).start()
        with shard_lock(tmp_path, 0, _waiting_notice(tmp_path)):
            pass
        holder.join()
        who = f"this run's rank (pid {os.getpid()})" if env["MASTER_PORT"] == "29555" else \
            f"another run (pid {os.getpid()})"
        assert capsys.readouterr().out == f"[dmtp] waiting for {who} that is writing the training data in {tmp_path}\n"
