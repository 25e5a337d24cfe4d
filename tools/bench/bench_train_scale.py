"""Training throughput at a real target's shapes: `python -m dmtp.train`'s own job (the FSDP strategy on one device,
bf16-mixed on a GPU) for a few steps, with s/step, tok/s, MFU with its FLOP count written out, peak memory, the
stall of a checkpoint, the run-end walk and the export, per injection variant; and where a step's time goes,
phase by phase on the device's clock (target forward, MTP chain, drafter forward, loss, backward, optimizer step,
between steps: `PhaseClock`), beside the top kernels of `--profile-steps`.

    python -m dmtp.tiny.random_target --shape qwen3-8b --out /dev/shm/qwen3-8b      # random weights, real shapes
    python tools/bench/bench_train_scale.py --target /dev/shm/qwen3-8b [--steps 20] [--seq-len 2048] [--batch 2] \\
        [--anchors 512] [--injections dual_anchor_zero_init,raw_dflash] [--peak-tflops 790] [--profile-steps 3] \\
        [--out train.json]

The data are the embedded corpora packed into rows of --seq-len (the target's own tokenizer), all supervised;
the walk runs once, at the last step, on --val-prompts code prompts. MFU = model FLOPs per step / step time /
--peak-tflops (a dense bf16 GEMM's rate on the device: ~790 TFLOP/s measured on an H200). Model FLOPs: the
frozen target's forward and the MTP's (no backward), the drafter's forward x 3 (forward + backward), each
matrix 2 FLOP per parameter per row, attention 2 * heads * head_dim per (query, key) pair for QK and PV alike
(causal: half the square), and the LM head over the rows that have logits.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

import dmtp.drafters.dflash as dflash
import dmtp.training.module as module_file
from dmtp.bench.args import add_machine_args, write_report
from dmtp.configs import compose_train
from dmtp.training.job import train


class Clock(L.Callback):
    """Wall times of the run's phases (CUDA synchronised), and which step intervals held a checkpoint."""

    def __init__(self, every: int):
        self.every = every
        self.marks: dict[str, float] = {}
        self.starts: list[float] = []
        self.module = None

    @staticmethod
    def now() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_fit_start(self, trainer, pl_module):
        self.marks["fit_start"] = self.now()
        self.module = pl_module
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.starts.append(self.now())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.marks["last_step_end"] = self.now()

    def on_validation_start(self, trainer, pl_module):
        self.marks["walk_start"] = self.now()

    def on_validation_end(self, trainer, pl_module):
        self.marks["walk_end"] = self.now()


# The phases of a training step, in order: each ends at its mark (the module's functions wrapped below, the
# trainer's hooks), and the step's remainder is the time from the last mark to the next step's start.
PHASES = ("target_forward", "mtp_chain", "drafter_forward", "loss", "backward", "optimizer", "between_steps")
WRAPPED = {"teacher_features": "target_forward", "mtp_block_inputs": "mtp_chain", "draft_blocks": "drafter_forward"}


class PhaseClock(L.Callback):
    """Where one training step's time goes, phase by phase (PHASES): a mark at the end of each, read on the device's
    own clock (CUDA events on the training stream: a phase's time includes the device waiting for the host), or
    the host's without CUDA. The target's forward, the MTP chain and the drafter's forward are marked by wrapping
    the module's functions of those names; the loss, backward and optimizer step by the trainer's hooks."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.steps: list[list[tuple[str, object]]] = []
        self.in_step = False   # the wrapped functions also run in validation: marked only inside a training step

    def mark(self, phase: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        else:
            event = time.perf_counter()
        self.steps[-1].append((phase, event))

    def wrap(self, module_file) -> None:
        """The module's phase functions, each marked at its end (in `module_file`'s namespace, where it calls them)."""
        for name, phase in WRAPPED.items():
            def marked(*args, _fn=getattr(module_file, name), _phase=phase, **kwargs):
                out = _fn(*args, **kwargs)
                if self.in_step:
                    self.mark(_phase)
                return out
            setattr(module_file, name, marked)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.steps:
            self.mark("between_steps")
        self.steps.append([])
        self.mark("start")
        self.in_step = True

    def on_before_backward(self, trainer, pl_module, loss):
        self.mark("loss")

    def on_after_backward(self, trainer, pl_module):
        self.mark("backward")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.mark("optimizer")
        self.in_step = False

    def seconds(self, skip: set[int]) -> dict[str, float]:
        """Median seconds per step of each phase, over the steps not in `skip` (the last step has no remainder)."""
        if self.cuda:
            torch.cuda.synchronize()
        per_phase: dict[str, list[float]] = {p: [] for p in PHASES}
        for i, marks in enumerate(self.steps):
            if i in skip:
                continue
            for (_, a), (phase, b) in zip(marks, marks[1:]):
                per_phase[phase].append(a.elapsed_time(b) / 1e3 if self.cuda else b - a)
        return {p: statistics.median(v) for p, v in per_phase.items() if v}


class StepProfile(L.Callback):
    """torch.profiler over `steps` training steps after `start` (the first run's): the top kernels by device
    time (CPU time without CUDA), and a Chrome trace where asked. Where the step's time goes, kernel by kernel."""

    def __init__(self, start: int, steps: int, trace: str | None = None, top: int = 30):
        self.start, self.steps, self.trace, self.top = start, steps, trace, top
        self.prof = None
        self.table = ""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.start and self.prof is None:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.prof = profile(activities=activities, record_shapes=False)
            self.prof.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.prof is not None and not self.table and trainer.global_step >= self.start + self.steps:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.prof.__exit__(None, None, None)
            key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
            self.table = self.prof.key_averages().table(sort_by=key, row_limit=self.top, max_name_column_width=60)
            if self.trace:
                self.prof.export_chrome_trace(self.trace)


def _params(modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def model_flops(module, seq: int, batch: int, anchors: int) -> dict[str, float]:
    """Model FLOPs of one training step, by part (see the module docstring)."""
    tc = module.target.config
    s, tokens = seq, seq * batch
    heads, head_dim = tc.num_attention_heads, getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    attn_pair = 2 * 2 * heads * head_dim                       # QK and PV, per (query, key) pair
    layers = module.target.decoder_layers()
    out = {"target_layers": 2 * _params(layers) * tokens,
           "target_attention": attn_pair * (s * s / 2) * len(layers) * batch,
           "target_lm_head": 2 * tc.hidden_size * tc.vocab_size * tokens}
    if module.mtp is not None:
        own = [p for n, p in module.mtp.named_parameters() if "embed" not in n and "lm_head" not in n]
        out["mtp"] = 2 * sum(p.numel() for p in own) * tokens + attn_pair * (s * s / 2) * batch
    drafter = module.drafter
    inj, backbone = drafter.injection, drafter.backbone
    rows = batch * anchors * inj.num_slots                     # the drafter's query rows
    d_layers = list(backbone.layers)
    kv = sum(m.weight.numel() for layer in d_layers for n, m in layer.named_modules() if n.endswith(("k_proj", "v_proj")))
    fwd = (2 * (backbone.fc.weight.numel()) * tokens            # the tapped features -> context rows
           + 2 * kv * tokens                                    # context K/V in every layer
           + 2 * _params(d_layers) * rows
           + attn_pair * rows * (s / 2 + inj.num_slots) * len(d_layers)
           + 2 * tc.hidden_size * tc.vocab_size * batch * anchors * inj.num_drafter_candidates)
    out["drafter_forward_backward"] = 3 * fwd
    out["total"] = sum(out.values())
    return out


def run_one(args, injection: str, root: Path) -> dict:
    cuda = torch.cuda.is_available() and args.accelerator != "cpu"
    run_dir = root / injection
    overrides = [
        "target=local", f"target.path={args.target}", f"target.dtype={'bfloat16' if cuda else 'float32'}",
        f"injection={injection}", "trainer=fsdp", f"trainer.accelerator={'gpu' if cuda else 'cpu'}", "trainer.devices=1",
        f"trainer.precision={'bf16-mixed' if cuda else '32-true'}", f"trainer.max_steps={args.steps}",
        f"trainer.val_check_interval={args.steps}", "trainer.log_every_n_steps=5",
        f"drafter.num_layers={args.layers}", f"drafter.num_target_features={args.taps}", f"drafter.block_size={args.block}",
        "data=embedded", "data.regenerate=false", f"data.seq_len={args.seq_len}", f"data.batch_size={args.batch}",
        f"data.max_examples={args.max_examples}", "data.val_domains=[code]", f"data.val_prompts={args.val_prompts}",
        f"model.num_anchors={args.anchors}", "model.label_source=data", "logger=none", "~callbacks.lr_monitor",
        f"callbacks.model_checkpoint.every_n_train_steps={args.checkpoint_every}",
        f"threads={args.threads}",
        "decode_eval.enabled=false",   # a training benchmark: the protocol's decoding after it is not what it times
    ]
    cfg = compose_train(overrides, output_dir=run_dir, tiny=False)
    clock = Clock(args.checkpoint_every)
    phases = PhaseClock(cuda)
    extra = [clock, phases]
    profiler = None
    if args.profile_steps:
        trace = str(Path(args.out).with_suffix(f".{injection}.trace.json")) if args.out else None
        profiler = StepProfile(args.warmup + 1, args.profile_steps, trace)
        extra.append(profiler)
    t0 = Clock.now()
    unwrapped = {name: getattr(module_file, name) for name in WRAPPED}
    phases.wrap(module_file)
    try:
        summary = train(cfg, callbacks=extra)
    finally:
        for name, fn in unwrapped.items():
            setattr(module_file, name, fn)
    done = Clock.now()
    if torch.distributed.is_initialized():   # the FSDP strategy's group: the next variant (or caller) starts afresh
        torch.distributed.destroy_process_group()
    steps = [b - a for a, b in zip(clock.starts, clock.starts[1:])]
    saved_after = {i for i in range(len(steps)) if (i + 1) % args.checkpoint_every == 0}   # interval after step i+1
    profiled = set(range(profiler.start, profiler.start + profiler.steps)) if profiler is not None else set()
    plain = [t for i, t in enumerate(steps) if i >= args.warmup and i not in saved_after | profiled] or steps
    step_s = statistics.median(plain)
    stalls = [steps[i] - step_s for i in sorted(saved_after) if i < len(steps)]
    flops = model_flops(clock.module, args.seq_len, args.batch, args.anchors)
    tokens = args.seq_len * args.batch
    marks = clock.marks
    walk = marks.get("walk_end", 0) - marks.get("walk_start", 0)
    return {
        "injection": injection, "steps": summary["global_step"], "s_per_step": step_s, "tok_s": tokens / step_s,
        "model_tflop_per_step": {k: v / 1e12 for k, v in flops.items()},
        "mfu": flops["total"] / step_s / (args.peak_tflops * 1e12),
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
        "checkpoint_stall_s": stalls,
        "setup_s": marks["fit_start"] - t0, "final_walk_s": walk,
        "after_last_step_s": done - marks["last_step_end"],
        "export_s": done - max(marks["last_step_end"], marks.get("walk_end", 0)),
        "drafter_params": _params([clock.module.drafter]),
        "checkpoint_gb": _largest_checkpoint_gb(run_dir),
        "phase_s": phases.seconds({i for i in range(len(steps)) if i < args.warmup or i in saved_after | profiled}),
        "profile": profiler.table if profiler is not None else None,
    }


def _largest_checkpoint_gb(run_dir: Path) -> float | None:
    files = list((run_dir / "checkpoints").glob("*.ckpt"))
    return max(f.stat().st_size for f in files) / 1e9 if files else None


def table(results: list[dict], peak: float) -> str:
    lines = [f"| variant | s/step | tok/s | model TFLOP/step | MFU (of {peak:g} TFLOP/s) | peak GB | checkpoint GB, stall s "
             "| final walk s | export s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        mem = f"{r['peak_memory_gb']:.1f}" if r["peak_memory_gb"] is not None else "-"
        ck = f"{r['checkpoint_gb']:.2f}, " + "/".join(f"{s:.2f}" for s in r["checkpoint_stall_s"]) if r["checkpoint_gb"] else "-"
        lines.append(f"| {r['injection']} | {r['s_per_step']:.3f} | {r['tok_s']:,.0f} | "
                     f"{r['model_tflop_per_step']['total']:.3g} | {100 * r['mfu']:.1f}% | {mem} | {ck} | "
                     f"{r['final_walk_s']:.1f} | {r['export_s']:.1f} |")
    parts = results[0]["model_tflop_per_step"]
    lines.append("\nmodel TFLOP per step (" + results[0]["injection"] + "): " +
                 ", ".join(f"{k} {v:.3g}" for k, v in parts.items()))
    lines.append("\nwhere a step's time goes (median ms per phase; share of the phases' sum):")
    lines.append("| variant | " + " | ".join(PHASES) + " |")
    lines.append("|---|" + "---|" * len(PHASES))
    for r in results:
        total = sum(r["phase_s"].values()) or 1.0
        cells = [f"{1e3 * r['phase_s'][p]:.1f} ({100 * r['phase_s'][p] / total:.0f}%)" if p in r["phase_s"] else "-"
                 for p in PHASES]
        lines.append(f"| {r['injection']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a checkpoint directory (e.g. dmtp.tiny.random_target's)")
    ap.add_argument("--injections", default="dual_anchor_zero_init,raw_dflash")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="step intervals left out of the median")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--layers", type=int, default=5, help="drafter layers (the experiment's drafter: 5)")
    ap.add_argument("--taps", type=int, default=5, help="tapped target layers")
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--max-examples", type=int, default=3000, help="embedded documents packed into rows")
    ap.add_argument("--val-prompts", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--block-group-rows", type=int, default=None,
                    help="rows per group of blocks in the drafter's attention (dmtp.drafters.dflash.BLOCK_GROUP_ROWS; "
                         "0: one dense mask; default: the shipped value)")
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="profile this many steps after the warm-up: top kernels printed (and a trace beside --out)")
    ap.add_argument("--accelerator", default="auto", choices=["auto", "cpu"])
    add_machine_args(ap, device=None, dtype=None)
    ap.add_argument("--workdir", default=None, help="run directories (default: a temporary one, removed)")
    args = ap.parse_args()
    if args.steps < args.checkpoint_every + 2:
        ap.error("--steps must exceed --checkpoint-every by 2 or more (a checkpoint's stall is measured between steps)")
    print("[bench_train_scale] random weights give meaningless acceptance; the times per step are real")
    if args.block_group_rows is not None:
        dflash.BLOCK_GROUP_ROWS = args.block_group_rows
    with tempfile.TemporaryDirectory(dir=args.workdir) as root:
        results = [run_one(args, name.strip(), Path(root)) for name in args.injections.split(",") if name.strip()]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and args.accelerator != "cpu" else "cpu"
    print(f"\n{device}, target {args.target}, seq {args.seq_len} x batch {args.batch}, {args.anchors} anchors, "
          f"drafter {args.layers} layers / {args.taps} taps / block {args.block}, {dflash.BLOCK_GROUP_ROWS} rows per "
          "group of blocks, FSDP on 1 device")
    print(table(results, args.peak_tflops))
    for r in results:
        if r["profile"]:
            print(f"\nwhere the step's time goes, {r['injection']} ({args.profile_steps} steps, top kernels):\n{r['profile']}")
    write_report(args.out, {"device": device, "args": vars(args), "block_group_rows": dflash.BLOCK_GROUP_ROWS,
                            "results": results})


if __name__ == "__main__":
    main()
