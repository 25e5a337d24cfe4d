"""Regeneration through vLLM (`data.regen_engine=vllm`) writes the shards dmtp's own regeneration
writes: the same greedy tokens, cut at the same EOS ids, under the same cache key."""
from __future__ import annotations

from collections import Counter

import pytest
from safetensors.torch import load_file

from tests.vllm_interop.common import ENGINE_ARGS, SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from dmtp.datagen.regenerate import RegenSettings, regenerate  # noqa: E402
from dmtp.serving.vllm.engine import make_llm  # noqa: E402

NEW = 48


def _shards(directory):
    return [load_file(str(p)) for p in sorted(directory.glob("shard-*.safetensors"))]


def test_greedy_regeneration_through_vllm_equals_dmtps(vllm_target, vllm_tokenizer, interop_prompts, tmp_path):
    eos = vllm_tokenizer.eos_token_id
    plain = regenerate(vllm_target, interop_prompts, RegenSettings(new_tokens=NEW), eos_token_id=eos,
                       cache_root=tmp_path / "probe", progress=False)
    # A second stop id, frequent in the target's responses, so that some responses end early: the EOS
    # cut is compared too, not only the budget's.
    stop = Counter(t for out in plain for t in out[1:]).most_common(1)[0][0]
    settings = dict(new_tokens=NEW, shard_size=5)   # two shards for 8 prompts
    ours = regenerate(vllm_target, interop_prompts, RegenSettings(**settings), eos_token_id=[eos, stop],
                      cache_root=tmp_path / "dmtp", progress=False)
    theirs = regenerate(vllm_target, interop_prompts, RegenSettings(**settings, engine="vllm", engine_args=ENGINE_ARGS),
                        eos_token_id=[eos, stop], cache_root=tmp_path / "vllm", progress=False)
    assert any(len(t) < NEW for t in ours) and any(len(t) == NEW for t in ours)
    assert theirs == ours
    (mine,), (vllms,) = (list((tmp_path / d).glob("regen-*")) for d in ("dmtp", "vllm"))
    assert mine.name == vllms.name                     # greedy: one cache key for both engines
    for a, b in zip(_shards(mine), _shards(vllms), strict=True):
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_engine_options_reach_vllm(vllm_target_dir):
    with pytest.raises(Exception, match="no_such_engine_option"):
        make_llm(vllm_target_dir, {**ENGINE_ARGS, "no_such_engine_option": 1})



def test_two_vllm_workers_write_the_shards_of_one(vllm_target, interop_prompts, tmp_path):
    """data.regen_engine=vllm shared out (dmtp.prepare step=regen workers=2): each worker's own engine writes its
    shards; sampled, every prompt's seed is its shard's, so the bytes are one worker's."""
    from dmtp.datagen.regenerate import write_share
    from dmtp.datagen.shards import Share

    settings = RegenSettings(new_tokens=NEW, temperature=1.0, seed=3, shard_size=3, engine="vllm",
                             engine_args=ENGINE_ARGS)                      # three shards for 8 prompts
    parts = [write_share(vllm_target, interop_prompts, settings, Share(2, i), cache_root=tmp_path / "two",
                         progress=False) for i in range(2)]
    assert [p.decoded for p in parts] == [[0, 2], [1]]
    one = write_share(vllm_target, interop_prompts, settings, Share(), cache_root=tmp_path / "one", progress=False)
    names = sorted(p.name for p in one.cache.glob("shard-*"))
    assert len(names) == 3
    assert all((one.cache / n).read_bytes() == (parts[0].cache / n).read_bytes() for n in names)
