"""Measure a stage-cost profile (dmtp.speed.profile) at a shape: every stage a decoding round can run, each the
loop's own code on its live state, interleaved and repeated, the fastest of each kept; on the CPU or a GPU (each
stage captured as its own CUDA graph there, as decoding replays it).

    python -m dmtp.bench.speed_profile --shape qwen3-8b --batch 1 32 --out DIR          # a GPU (random weights)
    python -m dmtp.bench.speed_profile --target assistant --batch 1 32                   # an embedded target, CPU
    python -m dmtp.bench.speed_profile --shape qwen3-8b --tiny --batch 1 --reps 3        # the CPU rehearsal

--shape: a `random_target --shape` name (dmtp.tiny.real_shapes), written once to --target-dir (random weights:
timings real); --target: a checkpoint directory or an embedded preset name. Writes <out>/<name>.b<batch>.json
for every --batch (name: <shape or preset>.<device>.<dtype>, e.g. qwen3-8b.h100.bf16), with the commit, device,
torch, date and this command. What each key is: dmtp.speed.recipe's docstring. How:

* verify/r<n>, mtp/catch_up/r<n>: the verify stage of [A, c1..c(n-1)] and the MTP's catch-up stage of an
  `mtp:<rows-1>` decoder after a prefill of --context tokens per request (`SpecDecoder.stages`);
* head/<full|v<V>>/r<n>: the LM head (full, or over V ids: dmtp.models.draft_vocab) on n rows per request and
  its argmax; mtp/step: one chained MTP row (`MTPState.step`); mtp/correction: a rank-128 MTP correction;
* slots/raw, fusion/t1: the slot builds of raw DFlash and dual_anchor_zero_init (`DrafterState.build`);
* drafter/b<B>: a random 1-layer, 1-tap DFlash drafter's two drafter stages (draft, context append); /layer, /tap,
  dspark/b<B>/markov, /confidence, dflash2/b<B>/selector: the same stages of a drafter that differs in that one
  part, less the 1-layer DFlash's (a difference of two measured minima, clamped at 0);
* "rounds": whole rounds of ar, mtp415, mtp:7 and 1-layer raw DFlash and DMTP drafters at the first block, as
  the loop runs them (`SpecDecoder.round_fn`, graphs where the probes have them), timed like the probes: the
  check of the composition (`--no-rounds` skips them).

Reps: every probe of every decoder once per rep, in one order, each followed by a restore of the state it changed
(the loop's snapshot of what its stages write); the clock: CUDA events on a GPU, this process's CPU time on a
CPU with one thread (other processes on the machine do not inflate it), else wall time."""
from __future__ import annotations

import argparse
import datetime
import gc
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dmtp.decode.execution.programs import state_reset
from dmtp.decode.stage import Stage
from dmtp.drafters.block_drafter import MTPBlockInputs, fresh_drafter_for
from dmtp.models.draft_vocab import DraftVocab
from dmtp.models.mtp_correction import MTPCorrection
from dmtp.speed.profile import PROFILES_DIR, SpeedProfile, StageCost
from dmtp.speed.recipe import head_key

DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
ROUND_METHODS = ("ar", "mtp415", "mtp:7")


@dataclass
class Probe:
    key: str
    run: Callable[[], None]
    writes: tuple = ()
    group: str = ""      # the decoder whose state it changes (restored after every run)


def _commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (with uncommitted changes)" if dirty else "")


def device_tag(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    for tag in ("h200", "h100", "b200", "a100", "l40s", "l4", "a10"):
        if tag in name:
            return tag
    return "cuda"


# --------------------------------------------------------------------------------------------------------------
# the decoders and their probes
# --------------------------------------------------------------------------------------------------------------

class Bench:
    """The target, its MTP and every decoder whose stages are probed at one batch."""

    def __init__(self, target, mtp, eos, device, dtype, context: int, batch: int, seed: int = 0):
        self.target, self.mtp, self.eos = target, mtp, eos
        self.device, self.dtype, self.context, self.batch, self.seed = device, dtype, context, batch, seed
        self.resets: dict[str, Callable[[], None]] = {}
        self.keep: list = []   # buffers the probes write (kept alive)
        self.graphs = False    # whether the probes are captured (the span rule)

    def prompts(self) -> list[list[int]]:
        vocab = self.target.config.vocab_size
        gen = torch.Generator().manual_seed(self.seed)
        return torch.randint(5, max(6, min(vocab, 2000)), (self.batch, self.context), generator=gen).tolist()

    def decoder(self, method: str, drafter=None, name: str | None = None):
        """A decoder after a prefill of the batch (its state live, every request past its budget: the rounds run
        at full shape and commit nothing, so the lengths stay at the context)."""
        from dmtp.families.decoding import build_decoder

        dec = build_decoder(self.target, method, self.eos, mtp=self.mtp, drafter=drafter, name=name,
                            cuda_graphs=False, time_stages=False)
        dec.generate(self.prompts(), max_new_tokens=2, batch_size=self.batch)
        st = dec.st
        dec.runner.span = self.span_of(dec, st.width)   # fixed for every probe (and capture)
        self.resets[name or method] = state_reset(dec.stages(st), None)
        return dec

    def span_of(self, dec, width: int) -> int:
        step = 256 if self.graphs else 32
        return min(dec.st.max_len, -(-(int(dec.runner.lengths.max()) + width + 1) // step) * step)

    def at_span(self, dec, width: int, run: Callable[[], None]) -> Callable[[], None]:
        """`run` attending the span a method verifying `width` rows attends (the loop's rule: every row below the
        longest length + width + 1, rounded up to 32 slots eager, to 256 with graphs), not the probed decoder's."""
        span = self.span_of(dec, width)

        def at():
            dec.runner.span = span
            run()

        return at

    def out(self, *shape, dtype=None) -> torch.Tensor:
        t = torch.zeros(*shape, dtype=dtype or self.dtype, device=self.device)
        self.keep.append(t)
        return t

    # -- the chain decoder: verify, catch-up, heads, MTP rows, correction -------------------------------------
    def chain_probes(self, max_rows: int, draft_vocabs, rows: bool = True) -> list[Probe]:
        """`rows`: also the verify and catch-up of 1..max_rows rows (else the MTP step, heads and correction only)."""
        dec = self.decoder(f"mtp:{max_rows - 1}", name="chain")
        st, m = dec.st, dec.proposer.mtp_state
        probes = []
        for n in range(1, max_rows + 1) if rows else ():
            stages = dec.stages(st, n - 1)
            verify = next(s for s in stages if s.name == "verify")
            catch_up = [s for s in stages if s.name == "mtp" and stages.index(s) > stages.index(verify)]
            probes.append(Probe(f"verify/r{n}", self.at_span(dec, n, verify.run), verify.writes, "chain"))
            if catch_up:
                probes.append(Probe(f"mtp/catch_up/r{n}", self.at_span(dec, n, catch_up[0].run), catch_up[0].writes,
                                    "chain"))
        head_rows = sorted({1, *self.head_rows})
        weight = self.target.lm_head.weight
        hidden = self.out(self.batch, max(head_rows), m.hidden_size)
        hidden.normal_()
        vocab = weight.shape[0]
        gen = torch.Generator().manual_seed(self.seed)
        vocabs = {v: DraftVocab(torch.randperm(vocab, generator=gen)[:v], vocab) for v in draft_vocabs if v < vocab}
        for rows in head_rows:
            picked = self.out(self.batch, rows, dtype=torch.long)
            h = hidden[:, :rows]
            probes.append(Probe(head_key(None, rows), lambda h=h, o=picked: o.copy_(m.mtp.logits(h).argmax(-1))))
            for v, dv in vocabs.items():
                probes.append(Probe(head_key(v, rows),
                                    lambda h=h, o=picked, dv=dv: o.copy_(m.mtp.logits(h, vocab=dv).argmax(-1))))
        g = self.out(self.batch, m.hidden_size)
        a = st.target_lengths()
        width = min(max([1, *self.head_rows]) + 1, max_rows)   # a chain as wide as the largest block's
        step = self.at_span(dec, width, lambda: g.copy_(m.step(st.anchor, m.h, a + 1, st.span)))
        probes.append(Probe("mtp/step", step, (), "chain"))
        correction = MTPCorrection(m.hidden_size, 128).to(self.device, self.dtype).eval()
        torch.nn.init.normal_(correction.up.weight, std=0.02)
        gc_out = self.out(self.batch, m.hidden_size)
        probes.append(Probe("mtp/correction", lambda: gc_out.copy_(correction(m.h))))
        self.keep.append(correction)
        return probes

    # -- block drafters ---------------------------------------------------------------------------------------
    def drafter_probes(self, block: int, mask_id: int) -> tuple[list[Probe], dict[str, list[str]]]:
        """Probes of every drafter at `block`, and which probe keys make up each drafter's stage."""
        variants = {  # name: (injection, layers, taps, backbone)
            "raw": ("raw_dflash", 1, 1, None), "raw_l2": ("raw_dflash", 2, 1, None),
            "raw_t2": ("raw_dflash", 1, 2, None), "dmtp": ("dual_anchor_zero_init", 1, 1, None),
            "dspark": ("raw_dflash", 1, 1, {"architecture": "dspark", "enable_confidence_head": False}),
            "dspark_conf": ("raw_dflash", 1, 1, {"architecture": "dspark", "enable_confidence_head": True}),
            "dflash2": ("raw_dflash", 1, 1, {"architecture": "dflash2"}),
        }
        probes, parts = [], {}
        for label, (injection, layers, taps, backbone) in variants.items():
            drafter = fresh_drafter_for(self.target, injection, mask_id, seed=self.seed, num_layers=layers,
                                        block_size=block, num_target_features=taps, backbone=backbone)
            drafter = drafter.to(self.device, self.dtype)
            group = f"b{block}/{label}"
            dec = self.decoder("drafter", drafter, name=group)
            stages = dec.stages(dec.st)
            keys = []
            for i, s in enumerate(s for s in stages if s.name == "drafter"):
                keys.append(f"{group}/drafter{i}")
                probes.append(Probe(keys[-1], s.run, s.writes, group))
            parts[label] = keys
            p, d = dec.proposer, dec.proposer.dstate
            if label == "raw":
                probes.append(Probe("slots/raw", lambda d=d, st=dec.st: d.build(st.anchor, None), (d.slots,), group))
            if label == "dmtp":
                mtp_in = MTPBlockInputs(p.mtp_tokens[:, None, :1], p.mtp_hidden[:, None], p.num_mtp[:, None], None)
                probes.append(Probe("fusion/t1", lambda d=d, st=dec.st, x=mtp_in: d.build(st.anchor, x), (d.slots,),
                                    group))
            self.keep.append(dec)
        return probes, parts


def time_probes(probes: list[Probe], resets: dict, reps: int, device: torch.device, graphs: bool,
                clock: Callable[[], float]) -> dict[str, float]:
    """key -> ms, the fastest of `reps` interleaved runs (each after one untimed run; CUDA graphs per probe when
    `graphs`)."""
    cuda = device.type == "cuda"
    runs = {p.key: p.run for p in probes}
    if graphs and cuda:
        from dmtp.decode.execution.graphs import RoundGraphs

        by_group: dict[str, list[Probe]] = {}
        for p in probes:
            by_group.setdefault(p.group, []).append(p)
        for group, members in by_group.items():
            stages = [Stage(p.key, p.run, p.writes) for p in members]
            captured = RoundGraphs(stages, granularity="stage").capture(reset=resets.get(group, lambda: None))
            for (key, fn, graph) in captured.items:
                runs[key] = graph.replay if graph is not None else fn

    def reset(p: Probe):
        if p.group in resets:
            resets[p.group]()

    for p in probes:   # first-call allocations, lazy tables
        runs[p.key]()
        reset(p)
    best = {p.key: float("inf") for p in probes}
    for _ in range(reps):
        for p in probes:
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                runs[p.key]()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = clock()
                runs[p.key]()
                ms = (clock() - t0) * 1e3
            best[p.key] = min(best[p.key], ms)
            reset(p)
    return best


def loop_rounds(bench: Bench, methods: dict, graphs: bool, new_tokens: int, reps: int,
                clock: Callable[[], float]) -> dict[str, float]:
    """ms of whole rounds of `methods` ({name: (method, drafter)}): each decoder decodes the batch for `new_tokens`
    (capturing its graphs when `graphs`), then its last round runs again as decoding ran it (`SpecDecoder.round_fn`),
    interleaved with the others' and timed like the probes."""
    from dmtp.families.decoding import build_decoder

    probes, resets, keep = [], {}, []
    for name, (method, drafter) in methods.items():
        dec = build_decoder(bench.target, method, bench.eos, mtp=bench.mtp, drafter=drafter, name=name,
                            cuda_graphs=graphs, time_stages=False)
        dec.generate(bench.prompts(), max_new_tokens=new_tokens, batch_size=bench.batch)
        resets[name] = state_reset(dec.stages(dec.st), None)
        probes.append(Probe(name, dec.round_fn(), (), name))
        keep.append(dec)
    return time_probes(probes, resets, reps, bench.device, False, clock)


# --------------------------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------------------------

def measure(target_dir: str, batch: int, args, name: str, device, dtype, shape: str) -> SpeedProfile:
    """The profile of one batch: every probe timed, the drafters' parts by difference, the whole rounds as checks."""
    from dmtp.bench.random_drafters import random_drafter_mask_id
    from dmtp.inference.setup import dtype_name, load_mtp, load_target, target_config

    loaded = load_target(target_config(target_dir, args.preset), device, dtype)
    target, mtp = loaded.model, load_mtp(loaded)
    mask_id = random_drafter_mask_id(loaded.tokenizer, target)
    bench = Bench(target, mtp, [], device, dtype, args.context, batch, args.seed)
    bench.graphs = bool(args.graphs and device.type == "cuda")
    blocks = sorted(set(args.blocks))
    bench.head_rows = sorted({r for b in blocks for r in (b - 2, b - 1) if r >= 1}) \
        if args.parts & {"chain", "drafters"} else []   # --parts heads: an MTP step's head alone (one row)
    t0 = time.perf_counter()
    probes = bench.chain_probes(max(blocks), parse_vocabs(args.draft_vocab, target.lm_head.weight.shape[0]),
                                rows="chain" in args.parts)
    parts_by_block = {}
    for b in blocks if "drafters" in args.parts else ():
        more, parts = bench.drafter_probes(b, mask_id)
        probes += more
        parts_by_block[b] = parts
    clock = time.process_time if device.type == "cpu" and torch.get_num_threads() == 1 else time.perf_counter
    graphs = bool(args.graphs and device.type == "cuda")
    best = time_probes(probes, bench.resets, args.reps, device, args.graphs, clock)
    where = (f"measured: {args.reps} interleaved reps, the fastest kept ({'CUDA graph replays' if graphs else 'eager'}"
             f", batch {batch}, context {args.context})")
    stages = {p.key: StageCost(best[p.key], f"{where}: {probe_what(p.key)}") for p in probes if "/drafter" not in p.key}
    stages.update(drafter_parts(parts_by_block, best, where))
    probe_s = time.perf_counter() - t0
    del probes
    bench.keep.clear()
    bench.resets.clear()
    gc.collect()
    rounds = round_checks(bench, blocks[0], mask_id, args, graphs, clock) if args.rounds else {}
    notes = ["Random drafters (timings real, acceptance meaningless); the target's weights as given."]
    if device.type == "cpu":
        notes.append("A CPU profile: at a small target a round is per-call overhead, not a served model's cost.")
    return SpeedProfile(name, batch, stages, shape=shape, device=_device_name(device), dtype=dtype_name(dtype),
                        context=args.context, provenance=_provenance(device, clock, args, graphs, probe_s, target_dir),
                        rounds=rounds, notes=notes, missing={})


def drafter_parts(parts_by_block: dict, best: dict, where: str) -> dict[str, StageCost]:
    """drafter/b<B> (the 1-layer, 1-tap DFlash drafter's stages) and each part as the difference of two drafters'."""
    stages = {}
    for b, parts in parts_by_block.items():
        total = {label: sum(best[k] for k in keys) for label, keys in parts.items()}
        stages[f"drafter/b{b}"] = StageCost(total["raw"], f"{where}: a random 1-layer, 1-tap raw DFlash drafter's "
                                                          "drafter stages (block forward + head + pick, context append)")
        for key, label, base, what in ((f"drafter/b{b}/layer", "raw_l2", "raw", "a second drafter layer"),
                                       (f"drafter/b{b}/tap", "raw_t2", "raw", "a second tapped target layer"),
                                       (f"dspark/b{b}/markov", "dspark", "raw", "DSpark's Markov head (rank 32)"),
                                       (f"dspark/b{b}/confidence", "dspark_conf", "dspark", "DSpark's confidence head"),
                                       (f"dflash2/b{b}/selector", "dflash2", "raw", "DFlash2's conv and selector")):
            diff = total[label] - total[base]
            stages[key] = StageCost(max(0.0, diff), f"{where}: {what}: the drafter stages of a drafter with it less "
                                                    f"one without ({total[label]:.4f} - {total[base]:.4f} ms"
                                                    + (", clamped at 0" if diff < 0 else "") + ")")
    return stages


def round_checks(bench: Bench, block: int, mask_id: int, args, graphs: bool, clock) -> dict[str, StageCost]:
    """Whole rounds of ar, mtp415, mtp:7 and 1-layer raw DFlash / DMTP drafters at `block` (`loop_rounds`)."""
    checks = {m: (m, None) for m in ROUND_METHODS}
    for inj in ("raw_dflash", "dual_anchor_zero_init") if "drafters" in args.parts else ():
        d = fresh_drafter_for(bench.target, inj, mask_id, seed=args.seed, num_layers=1, block_size=block,
                              num_target_features=1).to(bench.device, bench.dtype)
        checks[f"{inj} l1 t1 b{block}"] = ("drafter", d)
    how = (f"measured: the loop's whole round (SpecDecoder.round_fn after a {args.round_tokens}-token greedy decode of "
           f"the batch; {'CUDA graphs' if graphs else 'eager'}), {args.reps} interleaved reps, the fastest kept")
    return {key: StageCost(ms, how) for key, ms in loop_rounds(bench, checks, graphs, args.round_tokens, args.reps,
                                                                clock).items()}


def _device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"


def _provenance(device, clock, args, graphs: bool, seconds: float, target_dir) -> dict:
    return {"commit": _commit(), "device": _device_name(device), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m dmtp.bench.speed_profile " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
            "clock": ("CUDA events" if device.type == "cuda" else
                      "process CPU time" if clock is time.process_time else "wall time"),
            "reps": args.reps, "graphs": graphs, "seconds": round(seconds, 1), "target": target_dir}


def probe_what(key: str) -> str:
    if key.startswith("verify/"):
        return "the loop's verify stage (target forward, acceptance, commit)"
    if key.startswith("mtp/catch_up"):
        return "the MTP's catch-up stage over the verified rows"
    if key.startswith("head/"):
        return "the LM head on the rows and the argmax" + ("" if "/full/" in key else " (over the draft vocabulary's "
                                                                                       "ids, scattered back)")
    return {"mtp/step": "one chained MTP row (MTPState.step)", "mtp/correction": "a rank-128 MTP correction",
            "slots/raw": "raw DFlash's slot build (DrafterState.build)",
            "fusion/t1": "dual_anchor_zero_init's slot build with the T1 fusion (DrafterState.build)"}.get(key, key)


def random_shape(target_dir: Path) -> str | None:
    """The shape a random target was drawn with (its random_target.json), as --shape names it."""
    import json

    report = target_dir / "random_target.json"
    if not report.is_file():
        return None
    drawn = json.loads(report.read_text())
    return drawn.get("shape", "random") + ("-tiny" if drawn.get("tiny") else "")


def shipped_tokenizer() -> str | None:
    """A tokenizer the package ships (an embedded target's): a random target needs one, and building the micro target
    for it costs a minute on a machine that has none."""
    from dmtp.tiny.shipped import SHIPPED_DIR

    found = sorted(p for p in SHIPPED_DIR.iterdir() if (p / "tokenizer.json").is_file()) if SHIPPED_DIR.is_dir() else []
    return str(found[0]) if found else None


def parse_vocabs(spec: str, vocab: int) -> list[int]:
    if spec == "auto":
        sizes = (128, 256, 512, 768, 1024, 1536) if vocab <= 4096 else (4096, 8192, 16384, 32768, 65536)
        return [v for v in sizes if v < vocab]
    if spec in ("", "none"):
        return []
    return [int(v) for v in spec.split(",")]


def main(argv=None) -> int:
    from dmtp.bench.args import add_machine_args

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--shape", help="a random_target --shape name (dmtp.tiny.real_shapes): random weights")
    where.add_argument("--target", help="a checkpoint directory, or an embedded preset name (assistant, tiny, micro)")
    ap.add_argument("--tiny", action="store_true", help="--shape's small CPU version (the rehearsal)")
    ap.add_argument("--layers", type=int, default=None, help="--shape's depth (num_hidden_layers)")
    ap.add_argument("--target-dir", default=None, help="where --shape's random target is written (reused if there)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--context", type=int, default=256, help="tokens per request before the measured rounds")
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 16], help="block sizes (verify rows up to the largest)")
    ap.add_argument("--draft-vocab", default="auto", help="draft vocabulary sizes of the head, comma-separated "
                                                          "(auto: 128..1536 for a vocab <= 4096, else 4096..65536)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--parts", default="chain,drafters", help="what to probe: chain (verify, MTP, heads, correction), "
                                                              "heads (the MTP step, heads and correction alone) and/or "
                                                              "drafters (the block drafters' stages)")
    ap.add_argument("--no-cuda-graphs", dest="graphs", action="store_false", help="time eager stages on CUDA")
    ap.add_argument("--no-rounds", dest="rounds", action="store_false", help="skip the whole-round checks")
    ap.add_argument("--round-tokens", type=int, default=2,
                    help="tokens of each whole-round check's decode before its round is timed (2: the probes' context)")
    ap.add_argument("--name", default=None, help="the profile's name (default <shape>.<device>.<dtype>)")
    add_machine_args(ap, threads=1, seed=True)
    args = ap.parse_args(argv)
    args.parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not args.parts or args.parts - {"chain", "heads", "drafters"}:
        ap.error(f"--parts takes chain, heads and/or drafters, got {sorted(args.parts)}")
    from dmtp.inference.setup import placement

    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = placement(args.device, args.dtype)
    args.preset = "tiny"
    if args.shape:
        from dmtp.tiny.random_target import write_random_target

        shape = args.shape + ("-tiny" if args.tiny else "") + (f"-l{args.layers}" if args.layers else "")
        target_dir = Path(args.target_dir or Path(tempfile.gettempdir()) / f"dmtp-speed-{shape}")
        if not (target_dir / "config.json").is_file():
            write_random_target(args.shape, str(target_dir), tiny=args.tiny, layers=args.layers,
                                device=str(device), dtype=str(dtype).removeprefix("torch."),
                                tokenizer=shipped_tokenizer())
        target_dir = str(target_dir)
    elif Path(args.target).is_dir():
        target_dir, shape = args.target, random_shape(Path(args.target)) or Path(args.target).name
    else:   # an embedded preset
        target_dir, shape, args.preset = None, args.target, args.target
    name = args.name or f"{shape}.{device_tag(device)}.{DTYPE_SHORT.get(str(dtype).removeprefix('torch.'), 'x')}"
    out = Path(args.out or PROFILES_DIR)
    for batch in args.batch:
        profile = measure(target_dir, batch, args, name, device, dtype, shape)
        path = profile.save(out / profile.file_name())
        print(summary(profile))
        print(f"wrote {path}")
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


def summary(p: SpeedProfile) -> str:
    lines = [f"{p.label} ({p.device}, {p.dtype}, context {p.context}): ms"]
    keys = list(p.stages)
    for i in range(0, len(keys), 6):
        lines.append("  " + "  ".join(f"{k} {p.stages[k].ms:.4f}" for k in keys[i:i + 6]))
    if p.rounds:
        lines.append("  rounds: " + ", ".join(f"{k} {v.ms:.3f}" for k, v in p.rounds.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
