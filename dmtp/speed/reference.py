"""The shipped Qwen3-8B / H200 / bf16 speed profiles, from the one GPU measurement at that shape.

Source: shared/reference/real-scale.md, "Decoding"; BENCHMARKS.md "GPU day": 2026-12-04, one H200, torch
2.11+cu130, the project at `c3e183b`, random weights shaped like Qwen3-8B plus a random 8B-wide MTP layer, bf16,
CUDA graphs, `tools/bench_decode.py --random-drafters raw_dflash,dual_anchor_zero_init` (random drafters: 1 layer,
1 tap, block 8; and a published drafter's size, 5 layers, 5 taps, block 16). Measured before the loop's later
optimizations; `python -m dmtp.bench.speed_profile` on a GPU replaces them (tools/bench/gpu_profile.sh).

Every stage says where it came from: "measured: <which figure of which table>" or "derived: <formula>" from
measured figures and the shape's bytes (the LM head: 151936 x 4096 bf16 = 1.245 GB; the H200's copy bandwidth
measured ~4.3 TB/s). A stage nothing measured and nothing honestly derives is absent, with the reason under
"missing" (DSpark's Markov and confidence heads, DFlash2's selector at 8B; at batch 8 and 32 everything but the
AR round): a projection that needs one names it and gives no figure.

    python -m dmtp.speed.reference            # rewrites dmtp/speed/profiles/qwen3-8b.h200.bf16.b{1,8,32}.json
"""
from __future__ import annotations

import argparse

from dmtp.speed.profile import PROFILES_DIR, SpeedProfile, StageCost
from dmtp.speed.recipe import head_key

NAME = "qwen3-8b.h200.bf16"
HIDDEN, VOCAB, LAYERS = 4096, 151936, 36
BANDWIDTH_TBS = 4.3                     # real-scale.md: "a device-to-device copy measured ~4.3 TB/s"
DRAFT_VOCABS = (4096, 8192, 16384, 32768, 65536)
SOURCE = ("shared/reference/real-scale.md (2026-12-04, one H200, project at c3e183b, bf16, CUDA graphs, random "
          "weights shaped like Qwen3-8B; tools/bench_decode.py --random-drafters)")
WHERE = "real-scale.md 'Decoding', batch 1"
PROVENANCE = {"commit": "c3e183b", "device": "NVIDIA H200 (132 SMs)", "torch": "2.11.0+cu130", "date": "2026-12-04",
              "source": SOURCE, "command": "tools/bench_decode.py --random-drafters raw_dflash,dual_anchor_zero_init",
              "clock": "CUDA events between graph replays (the loop's stage timer)",
              "written_by": "python -m dmtp.speed.reference"}


def _ms(nbytes: float) -> float:
    return nbytes / (BANDWIDTH_TBS * 1e12) * 1e3


def batch1() -> SpeedProfile:
    s: dict[str, StageCost] = {}
    _measured(s)
    _derived(s)
    missing = {}
    notes = ["DSpark's Markov and confidence heads and DFlash2's conv and selector were never measured at 8B shapes: "
             "their stages are lower bounds from the bytes they read (a few small kernels per slot, whose launch "
             "floors the bytes leave out, may cost more).","Measured before the loop's later optimizations (graph span buckets, grouped-query attention without "
             "the K/V copy): today's rounds are expected faster; python -m dmtp.bench.speed_profile on a GPU replaces "
             "these.", "Derived by bytes / bandwidth omits kernel-launch floors (a few microseconds per kernel under "
             "graphs)."]
    return SpeedProfile(NAME, 1, s, shape="qwen3-8b", device="cuda: NVIDIA H200", dtype="bfloat16", context=None,
                        provenance=PROVENANCE, missing=missing, rounds=_rounds(), notes=notes)


def _measured(s: dict) -> None:
    def put(key, ms, source):
        s[key] = StageCost(ms, source)

    put("verify/r1", 9.38, f"measured: {WHERE}, row AR: 9.38 ms/round (an AR round is the verify stage of one row)")
    put("verify/r8", 10.46, f"measured: {WHERE}, row 'raw DFlash, 1 layer, block 8': verify 8 rows 10.46")
    put("verify/r16", 11.26, f"measured: {WHERE}, row 'raw DFlash, 5 layers, 5 taps, block 16': verify 16 rows 11.26")
    put("drafter/b8", 0.77, f"measured: {WHERE}, row 'raw DFlash, 1 layer, block 8': drafter 0.77 (a 1-layer, 1-tap "
                            "drafter: block forward, head over 7 slots, context append)")
    put("mtp/catch_up/r8", 0.41, f"measured: {WHERE}, row 'DMTP, 1 layer, block 8': MTP 0.41 (with one MTP step the "
                                 "loop's mtp stage is the catch-up over the 8 verified rows; T1's head is in t1_fusion)")


def _derived(s: dict) -> None:
    def put(key, ms, source):
        s[key] = StageCost(ms, source)

    # from the bytes read
    head = _ms(VOCAB * HIDDEN * 2)
    for rows in (1, 6, 7, 14, 15):
        put(head_key(None, rows), head, f"derived: {VOCAB} x {HIDDEN} x 2 B (the LM head, bf16) / {BANDWIDTH_TBS} TB/s "
                                        f"= {head:.3f} ms ({rows} row(s) at batch 1: the weights dominate)")
        for v in DRAFT_VOCABS:
            ms = _ms(v * HIDDEN * 2 + 2 * VOCAB * 2)
            put(head_key(v, rows), ms, f"derived: ({v} x {HIDDEN} x 2 B (the draft vocabulary's rows) + 2 x {VOCAB} x "
                                       f"2 B (the -inf row and its scatter)) / {BANDWIDTH_TBS} TB/s = {ms:.4f} ms "
                                       "(kernel-launch floors not counted)")
    # from measured figures
    put("fusion/t1", 0.40 - head, f"derived: t1_fusion stage 0.40 ({WHERE}, row 'DMTP, 1 layer, block 8': fusion "
                                  f"0.40, T1's head included) - head/full/r1 ({head:.3f}) = {0.40 - head:.3f}")
    put("slots/raw", 11.36 - 0.77 - 10.46, f"derived: raw DFlash round 11.36 - drafter 0.77 - verify 10.46 ({WHERE}, "
                                           "row 'raw DFlash, 1 layer, block 8') = 0.13: the slot build and the rest")
    for n in range(2, 8):
        ms = 9.38 + (10.46 - 9.38) * (n - 1) / 7
        put(f"verify/r{n}", ms, f"derived: linear in rows between verify/r1 (9.38) and verify/r8 (10.46) = {ms:.3f}")
    for n in range(9, 16):
        ms = 10.46 + (11.26 - 10.46) * (n - 8) / 8
        put(f"verify/r{n}", ms, f"derived: linear in rows between verify/r8 (10.46) and verify/r16 (11.26) = {ms:.3f}")
    for n in range(1, 17):
        if n != 8:
            put(f"mtp/catch_up/r{n}", 0.41, "derived: = mtp/catch_up/r8 (0.41, measured): the same MTP layer over "
                                            f"{n} rows instead of 8 (the same weights read)")
    step = (13.06 - s["verify/r5"].ms - 4 * head - s["mtp/catch_up/r5"].ms) / 3
    put("mtp/step", step, f"derived: (MTP415's round 13.06 ({WHERE}, row MTP415) - verify/r5 "
                          f"({s['verify/r5'].ms:.2f}) - 4 x "
                          f"head/full/r1 ({head:.3f}) - mtp/catch_up/r5 (0.41)) / 3 chained rows = {step:.3f} "
                          "(0.41 if a chained row cost what the catch-up does)")
    put("mtp/correction", s["fusion/t1"].ms, f"derived (upper bound): <= fusion/t1 ({s['fusion/t1'].ms:.3f}): the "
                                             "T1 fusion is an RMSNorm pair and a 8192->4096 linear, the rank-128 "
                                             "correction an RMSNorm and two linears of 1/64 its bytes")
    for b, verify in ((8, 10.46), (16, 11.26)):
        layer = (verify - head) / LAYERS
        put(f"drafter/b{b}/layer", layer, f"derived: (verify/r{b} {verify} - head/full {head:.3f}) / {LAYERS} target "
                                          f"layers = {layer:.3f}: a drafter layer has a target layer's widths and "
                                          f"reads the context for {b} rows")
        tap = _ms(HIDDEN * HIDDEN * 2)
        put(f"drafter/b{b}/tap", tap, f"derived: {HIDDEN} x {HIDDEN} x 2 B (the context projection's input per tapped "
                                      f"layer) / {BANDWIDTH_TBS} TB/s = {tap:.4f}")
    for b in (8, 16):
        _small_heads(s, b)
    d16 = 2.30 - 4 * s["drafter/b16/layer"].ms - 4 * s["drafter/b16/tap"].ms
    put("drafter/b16", d16, f"derived: the 5-layer, 5-tap drafter's stage 2.30 ({WHERE}, row 'raw DFlash, 5 layers, 5 "
                            f"taps, block 16') - 4 x drafter/b16/layer - 4 x drafter/b16/tap = {d16:.3f}")


def _small_heads(s: dict, b: int, rank: int = 32, top_k: int = 8, conv_kernel: int = 2) -> None:
    """DSpark's heads and DFlash2's selector at block b, from the bytes they read (lower bounds: launches left out).

    The Markov walk runs slot by slot: each of the b - 1 slots reads W2 [V, r] and writes and picks from a bias row
    over V; the confidence head is one [H + r] -> 1 projection per slot; DFlash2's selector reads r-wide codebook rows
    for its top-K candidates, a [r, H] projection, and its per-layer grouped convolutions read a few H-wide rows."""
    slots = b - 1
    markov = _ms(slots * (VOCAB * rank * 2 + VOCAB * 4 * 2))
    s[f"dspark/b{b}/markov"] = StageCost(markov, f"derived (lower bound): {slots} slots x ({VOCAB} x {rank} x 2 B (W2) + "
                                                 f"2 x {VOCAB} x 4 B (the bias row, written and read by the pick)) / "
                                                 f"{BANDWIDTH_TBS} TB/s = {markov:.4f} ms (launches not counted)")
    conf = _ms(slots * (HIDDEN + rank) * 2)
    s[f"dspark/b{b}/confidence"] = StageCost(conf, f"derived (lower bound): {slots} slots x ({HIDDEN} + {rank}) x 2 B / "
                                                   f"{BANDWIDTH_TBS} TB/s = {conf:.6f} ms (launches not counted)")
    sel = _ms(rank * HIDDEN * 2 + slots * (top_k + 1) * rank * 2 + 2 * conv_kernel * HIDDEN * 2)
    s[f"dflash2/b{b}/selector"] = StageCost(sel, f"derived (lower bound): ({rank} x {HIDDEN} (W_h) + {slots} slots x "
                                                 f"({top_k} + 1) codebook rows x {rank} + 2 convolutions x {conv_kernel} x "
                                                 f"{HIDDEN}) x 2 B / {BANDWIDTH_TBS} TB/s = {sel:.6f} ms "
                                                 "(launches not counted)")


def _rounds() -> dict[str, StageCost]:
    """The whole rounds the H200 measured at batch 1: what the composition must reproduce."""
    return {
        "ar": StageCost(9.38, f"measured: {WHERE}, row AR"),
        "mtp415": StageCost(13.06, f"measured: {WHERE}, row MTP415 (4 MTP steps)"),
        "raw_dflash l1 t1 b8": StageCost(11.36, f"measured: {WHERE}, row 'raw DFlash, 1 layer, block 8'"),
        "dual_anchor_zero_init l1 t1 b8": StageCost(12.06, f"measured: {WHERE}, row 'DMTP, 1 layer, block 8'"),
        "raw_dflash l5 t5 b16": StageCost(13.60, f"measured: {WHERE}, row 'raw DFlash, 5 layers, 5 taps, block 16'"),
        "dual_anchor_zero_init l5 t5 b16": StageCost(14.48, f"measured: {WHERE}, row 'DMTP, 5 layers, 5 taps, block 16'"),
    }


def larger_batch(batch: int) -> SpeedProfile:
    """Batch 8 and 32: the AR round only (real-scale.md's batch figures are whole rounds, not stages)."""
    where = "real-scale.md 'Decoding'"
    if batch == 8:
        stages = {"verify/r1": StageCost(11.41, f"measured: {where}: 'Batch 8: AR 11.41 ms/round'")}
        rounds = {"ar": stages["verify/r1"]}
    elif batch == 32:
        stages = {"verify/r1": StageCost(18.0, f"measured (approximate, prefill included): {where}: 'Batch 32 (tok/s "
                                               "with prefill): AR 666 (~18 ms/round)'")}
        rounds = {"ar": stages["verify/r1"],
                  "raw_dflash l1 t1 b8": StageCost(33.0, f"measured (approximate): {where}: 'raw ~33 ms'"),
                  "dual_anchor_zero_init l1 t1 b8": StageCost(34.0, f"measured (approximate): {where}: 'DMTP ~34 ms'")}
    else:
        raise ValueError(f"no reference figures at batch {batch}")
    missing = {"verify/r2..r16": f"the verify of K rows was never measured at batch {batch}",
               "mtp/*, head/*, fusion/t1, slots/raw": f"no MTP, head or slot stage was measured at batch {batch}",
               "drafter/*, dspark/*, dflash2/*": f"only whole drafter rounds were measured at batch {batch}"}
    return SpeedProfile(NAME, batch, stages, shape="qwen3-8b", device="cuda: NVIDIA H200", dtype="bfloat16",
                        provenance=PROVENANCE, missing=missing, rounds=rounds,
                        notes=["Whole rounds only: every method but AR projects to no figure here until "
                               "python -m dmtp.bench.speed_profile runs at this batch on a GPU."])


def profiles() -> list[SpeedProfile]:
    return [batch1(), larger_batch(8), larger_batch(32)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Write the shipped Qwen3-8B/H200 speed profiles from real-scale.md's "
                                             "figures.")
    ap.add_argument("--out", default=str(PROFILES_DIR), help="directory (default: the package's profiles)")
    args = ap.parse_args(argv)
    for p in profiles():
        print(f"wrote {p.save(f'{args.out}/{p.file_name()}')}")


if __name__ == "__main__":
    main()
