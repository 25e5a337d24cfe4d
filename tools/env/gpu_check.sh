#!/usr/bin/env bash
# The GPU day check: one prepared call on a lent CUDA machine, which has NO network (BENCHMARKS.md, "GPU day").
# Here first, with PyPI reachable:   bash tools/env/gpu_wheelhouse.sh          (-> gpu_wheels/, ignored by git)
# Then, on the machine:              run(command="bash tools/env/gpu_check.sh", carry=["gpu_wheels"], timeout_s=540)
#
# Steps, each under its own timeout; a step that fails is reported and the next one runs:
#   install  the wheelhouse offline (--no-index --find-links gpu_wheels: what the image lacks, fallbacks for
#            what it has), dflash --no-deps, the project itself --no-deps -e . (PYTHONPATH=. either way)
#   probe    GPU, torch/triton, the optional kernels importable (flash-attn, fla, causal-conv1d: the last
#            two are what dmtp's hybrid kernel path needs together), a CUDA graph captured and replayed
#   target   the embedded micro target under $DMTP_HOME (the tests and benchmarks share it): the copy that
#            gpu_wheelhouse.sh put in gpu_wheels/dmtp_home when its cache key still matches, else built here
#   tests    python -m pytest -m gpu tests: graphs == eager tokens and accepted lengths for every method,
#            sampling under graphs, the hybrid and DeepSeek/GLM runners under graphs, flash-attn and the
#            fla/causal-conv1d kernels where installed (skip reasons listed)
#   bench    tools/bench/bench_decode.py on the micro target, CUDA graphs on, then off
#   trained  where gpu_wheels/trained/ was carried (GPU_TRAINED_* in gpu_wheelhouse.sh): tools/bench/bench_decode.py on
#            that trained target and its drafters, CUDA graphs on, batch 1 and all prompts at 8 / 32
#   peer     tools/bench/bench_peer.py: the reference dflash_generate vs our loop (eager and CUDA graphs) on the
#            same untrained raw DFlash drafter; identical greedy tokens
#   realsize (not in the default list: GPU_CHECK_STEPS="realsize" runs it alone, ~6.5 min on an H200 by estimate)
#            a Qwen3-8B-shaped random target drawn on the GPU into /dev/shm (dmtp.tiny.random_target; kept
#            for a rerun while the machine is warm), then, each its own timed sub-step, into realsize.txt:
#            rs_table   tools/bench/profile_decode.py: memory floor, ms per round and per stage of AR, MTP415, raw
#                       DFlash and DMTP with a published-size random drafter (5 layers, 5 taps, block 16),
#                       batch 1 / 8 / 32, context 256, CUDA graphs, bf16
#            rs_peer    tools/bench/bench_peer.py --dtype bfloat16: the reference dflash_generate (one request at a
#                       time) vs our loop on the same target and drafter, and AR vs transformers generate()
#            rs_context AR at batch 1 and 32, contexts 256 / 2k / 8k, GQA repeat (the old K/V copy) vs grouped
#            rs_kernels per-kernel time of one AR step and one verify round (torch.profiler), batch 1
#            rs_attention one attention call per GQA mode at 8B attention shapes (tools/micro/bench_attention.py), and
#                       the drafter's forward with its context cache copied vs attended in place (bench_drafter_kv.py)
#            rs_train   realsize_train: tools/micro/bench_block_attention.py (the drafter's training attention, dense
#                       mask vs groups of blocks), then tools/bench/bench_train_scale.py, 20 FSDP training steps at 8B
#                       shapes for DMTP and raw DFlash (~3-4 min by estimate: its own call, GPU_CHECK_STEPS="realsize_train")
#            rs_data    in realsize_train's call, after it: tools/bench/bench_data.py --target at 8B shapes: the feature
#                       cache's capture (bf16, fp8: bytes/s, B/token) of 16 rows x 2048 tokens, and training steps/s
#                       fed by the bf16 cache vs by the target's forward (bf16-mixed, 5-layer drafter, 512 anchors)
#   issue41  (not in the default list: GPU_CHECK_STEPS="issue41", one call, ~5 min by estimate) the Qwen3-8B-shaped
#            random target (rs_target, reused when warm), then into issue41.txt:
#            vl_tables  tools/bench/bench_verify_length.py --tables-only: verify_length=auto's cost table T(L), a round at
#                       each L = 0..7 captured as its own CUDA graph and timed (bf16, batch 1 / 8 / 32, a random
#                       published-size DSpark drafter at block 8), and the L the policy picks from each table for the
#                       survival the tiny target's trained DSpark drafter had on CPU (GPU_VL_SURVIVAL)
#            vl_trained where gpu_wheels/trained/ was carried with drafters that predict acceptance (DSpark, DMTP):
#                       auto vs the full block vs AR, tok/s at batch 1 / 8 / 32, CUDA graphs, fp32, interleaved
#            lc_context tools/bench/bench_long_context.py: a round's ms, the drafter's and the verify's apart, at
#                       contexts GPU_LC_CONTEXTS (2k 8k 32k 64k), batch 1, raw DFlash and DMTP published-size random
#                       drafters with full layers and the same with every layer a sliding window (GPU_LC_WINDOW, 2048)
#            Knobs: GPU_REALSIZE_DIR (/dev/shm/dmtp_realsize), GPU_REALSIZE_SHAPE_ARGS (extra
#            dmtp.tiny.random_target options, e.g. "--tiny" for a CPU rehearsal), GPU_REALSIZE_CONTEXTS
#            ("256 2048 8192"), GPU_REALSIZE_BATCHES ("1 8 32").
# Output: $OUT (the device tool's folder), else $1, else gpu_check_out/ -- at most 8 files come back:
#   summary.txt (one line per step: rc, seconds), install.log, probe.txt, gpu_tests.txt, bench_decode.txt,
#   bench_peer.txt (the trained step's table appended), realsize.txt, reports.tar.gz (the JSON reports and the
#   tests' junit XML); issue41.txt in its place when that step runs instead.
# Knobs: GPU_CHECK_STEPS="tests peer" runs a subset (a rerun in what is left of the lease; install always
# runs); GPU_CHECK_TIME_SCALE=4 stretches every timeout (a CPU rehearsal); PYTHON (default python3);
# GPU_WHEELS (default gpu_wheels).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-${1:-gpu_check_out}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d /tmp/gpu_check.XXXXXX)"
PY="${PYTHON:-python3}"
WHEELS="$(cd "${GPU_WHEELS:-gpu_wheels}" 2>/dev/null && pwd || echo "${GPU_WHEELS:-gpu_wheels}")"
STEPS="${GPU_CHECK_STEPS:-probe target tests bench trained peer}"
SCALE="${GPU_CHECK_TIME_SCALE:-1}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1
if [ -z "${DMTP_HOME:-}" ] && [ -d "$WHEELS/dmtp_home" ]; then   # the carried micro target, in a writable copy
    cp -r "$WHEELS/dmtp_home" "$work/dmtp_home" && export DMTP_HOME="$work/dmtp_home"
fi
summary="$out/summary.txt"
t_start=$(date +%s)
echo "gpu_check $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(date -u +%FT%TZ) steps: install $STEPS" | tee "$summary"

# step NAME SECONDS CMD...: runs CMD under `timeout` (SECONDS x SCALE), logs "NAME rc=.. s=.." to summary.txt.
step() {
    local name=$1 limit=$(( $2 * SCALE )); shift 2
    local t0=$(date +%s)
    timeout -k 10 "$limit" bash -c '"$@"' "$name" "$@"   # a new bash: `timeout` cannot run a function itself
    local rc=$?
    local note=""; [ $rc -eq 124 ] || [ $rc -eq 137 ] && note=" (timed out at ${limit}s)"
    echo "$name rc=$rc s=$(( $(date +%s) - t0 ))$note" | tee -a "$summary"
    return $rc
}
wants() { [[ " $STEPS " == *" $1 "* ]]; }
# Only the wheelhouse: no config file, no PIP_* variable (its build-dependency subprocess reads them too,
# --isolated or not), no index (the machine has no network anyway).
pip_offline() {
    local unset=() v
    for v in $(compgen -e | grep '^PIP_'); do unset+=(-u "$v"); done
    env "${unset[@]}" PIP_CONFIG_FILE=/dev/null "$PY" -m pip --isolated install -q --no-index \
        --find-links "$WHEELS" --no-cache-dir --no-compile --disable-pip-version-check "$@"
}

install() {
    # Names only, no versions: what the image already has stays as it is; the rest comes from the wheels.
    local pkgs=(hydra-core omegaconf antlr4-python3-runtime flash-linear-attention fla-core einops
                pytest pytest-timeout scipy)
    echo "== $PY: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
    echo "== wheelhouse $WHEELS: $(ls "$WHEELS"/*.whl 2>/dev/null | wc -l) wheels, $(du -sh "$WHEELS" 2>/dev/null | cut -f1)"
    local failed=()
    if ! pip_offline "${pkgs[@]}"; then
        echo "== all at once failed: one at a time"
        for p in "${pkgs[@]}"; do pip_offline "$p" || failed+=("$p"); done
    fi
    pip_offline --no-deps dflash || failed+=(dflash)
    pip_offline --no-deps -e . || failed+=("dmtp (-e .; PYTHONPATH=. serves instead)")
    echo "== not installed: ${failed[*]:-none}"
    "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|triton|lightning|transformers|safetensors|hydra-core|omegaconf|antlr4-python3-runtime|dflash|flash-attn|flash-linear-attention|fla-core|causal-conv1d|pytest|pytest-timeout|scipy|numpy|einops|dmtp) '
    [ ${#failed[@]} -eq 0 ]
}

probe() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: not available"
    "$PY" - <<'EOF'
import importlib, importlib.metadata as md, platform, sys
import torch
print(f"python {platform.python_version()}  torch {torch.__version__}  cuda build {torch.version.cuda}  "
      f"cuda available {torch.cuda.is_available()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device {p.name}  capability {p.major}.{p.minor}  {p.total_memory / 2**30:.0f} GiB  {p.multi_processor_count} SMs")
for dist in ("triton", "transformers", "lightning", "hydra-core", "omegaconf", "dflash", "pytest", "scipy",
             "flash-attn", "flash-linear-attention", "fla-core", "causal-conv1d", "dmtp"):
    try:
        print(f"  {dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"  {dist} -")
def importable(mod):
    try:
        importlib.import_module(mod)
        return "yes"
    except Exception as e:   # a kernel package that imports but cannot load is as absent as a missing one
        return f"no ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
print("optional kernels:")
for label, mod in (("flash-attn", "flash_attn"), ("fla (gated delta rule)", "fla.ops.gated_delta_rule"),
                   ("causal-conv1d", "causal_conv1d")):
    print(f"  {label}: {importable(mod)}")
from dmtp.decode.runners.base import flash_attn_available
from dmtp.models import gdn_kernels
print(f"  dmtp flash-attn path: {flash_attn_available()}")
print(f"  dmtp hybrid kernel path (fla + causal-conv1d): {gdn_kernels.available()}")
if torch.cuda.is_available():
    try:   # the decode loop's CUDA-graph path needs capture + replay to work on this driver
        x = torch.zeros(8, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = x * 2 + 1
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2 + 1
        x.fill_(3)
        g.replay()
        torch.cuda.synchronize()
        print(f"  CUDA graphs: capture + replay {'ok' if bool((y == 7).all()) else 'WRONG RESULT'}")
    except Exception as e:
        print(f"  CUDA graphs: failed ({type(e).__name__}: {e})")
else:
    print("  CUDA graphs: no CUDA device")
EOF
}

build_target() {
    "$PY" - <<'EOF'
from dmtp.tiny.targets import default_target_dir, ensure_tiny_target
carried = (default_target_dir("micro") / "build_report.json").exists()
print(ensure_tiny_target("micro", progress=False), "(carried)" if carried else "(built here)")
EOF
}

gpu_tests() {
    local per_test=()   # one hung test must not take the whole step
    "$PY" -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout 150)
    "$PY" -m pytest -q -m gpu tests -p no:cacheprovider -rs "${per_test[@]}" --junitxml "$work/gpu_tests.xml"
}

bench_decode() {   # $1: "" (CUDA graphs on) or --no-cuda-graphs
    local name=bench${1:+_eager}
    echo "== bench_decode ${1:-(CUDA graphs on)}"
    "$PY" tools/bench/bench_decode.py --preset micro --random-drafters raw_dflash,dual_anchor_zero_init \
        --num-prompts 8 --max-new-tokens 64 --batch-size 8 $1 --out "$work/$name.json"
}

bench_trained() {   # a trained target's drafters: tau means something here (the micro ones are random)
    local drafters=() d
    for d in "$WHEELS"/trained/drafters/*/; do drafters+=(--drafter "${d%/}"); done
    echo "== bench_decode on the carried trained target, CUDA graphs on (if CUDA)"
    "$PY" tools/bench/bench_decode.py --target "$WHEELS/trained/target" "${drafters[@]}" --num-prompts 8 \
        --max-new-tokens 128 --batch-size 1 --throughput-batch-sizes 8 32 --reps 2 ${GPU_TRAINED_DTYPE:+--dtype $GPU_TRAINED_DTYPE} \
        --out "$work/bench_trained${GPU_TRAINED_DTYPE:+_$GPU_TRAINED_DTYPE}.json"
}

bench_peer() {
    local dev graphs=""
    dev=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
    [ "$dev" = cuda ] && graphs=--cuda-graphs
    "$PY" tools/bench/bench_peer.py --preset micro --random-drafter --device "$dev" $graphs --num-prompts 2 \
        --max-new-tokens 64 --reps 2 --hf-batch-sizes 1 8 --out "$work/bench_peer.json"
}

# ---- realsize: Qwen3-8B shapes, random weights (timings real, acceptance meaningless) --------------------
RS_DIR="${GPU_REALSIZE_DIR:-/dev/shm/dmtp_realsize}"
RS_SHAPE_ARGS="${GPU_REALSIZE_SHAPE_ARGS:-}"
RS_CONTEXTS="${GPU_REALSIZE_CONTEXTS:-256 2048 8192}"
RS_BATCHES="${GPU_REALSIZE_BATCHES:-1 8 32}"
RS_DRAFTER="--random-drafter-preset dflash-qwen3-8b"   # 5 layers, 5 taps, block 16: the published size

rs_target() {   # drawn on the GPU, ~1 GiB shards to /dev/shm; reused when a warm machine still has it
    if [ -f "$RS_DIR/random_target.json" ]; then echo "== reusing $RS_DIR"; cat "$RS_DIR/random_target.json"; return 0; fi
    rm -rf "$RS_DIR"
    "$PY" -m dmtp.tiny.random_target --shape qwen3-8b --out "$RS_DIR" $RS_SHAPE_ARGS
}

rs_table() {    # the batch table: every method, each batch, context 256, CUDA graphs, bf16
    "$PY" tools/bench/profile_decode.py --target "$RS_DIR" --dtype bfloat16 $RS_DRAFTER \
        --methods ar,mtp415,raw_dflash,dual_anchor_zero_init --batch-sizes $RS_BATCHES --contexts 256 \
        --new-tokens 48 --kernels 0 --out "$work/realsize_table.json"
}

rs_peer() {     # the reference loop on the same target and drafter size, bf16, batch 1 (it decodes one request at a time)
    local dev graphs=""
    dev=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
    [ "$dev" = cuda ] && graphs=--cuda-graphs
    "$PY" tools/bench/bench_peer.py --target "$RS_DIR" --random-drafter $RS_DRAFTER --dtype bfloat16 --device "$dev" \
        $graphs --domains code,math --num-prompts 1 --max-new-tokens 64 --reps 1 --temperature 0 --hf-batch-sizes 1 \
        --out "$work/realsize_peer.json"
}

rs_context() {  # attention reads per request length: AR batch 1 vs 32 at each context, the old K/V copy vs none
    local batches b
    batches=$(for b in $RS_BATCHES; do echo "$b"; done | sort -n | sed -n '1p;$p' | sort -nu | tr '\n' ' ')
    "$PY" tools/bench/profile_decode.py --target "$RS_DIR" --dtype bfloat16 --methods ar --batch-sizes $batches \
        --contexts $RS_CONTEXTS --gqa-modes repeat grouped --new-tokens 24 --kernels 0 --out "$work/realsize_context.json"
}

rs_attention() {   # one attention call per GQA mode at 8B attention shapes: the K/V copy's cost alone, no model
    local dev dtype=float32
    dev=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
    [ "$dev" = cuda ] && dtype=bfloat16
    "$PY" tools/micro/bench_attention.py --device "$dev" --dtype "$dtype" --batch-sizes $RS_BATCHES --rows 1 16 \
        --slots $RS_CONTEXTS --out "$work/realsize_attention.json"
    # The published-size drafter's forward with its context cache copied per round vs attended in place.
    local hidden=4096; [ "$dev" = cuda ] || hidden=64
    "$PY" tools/micro/bench_drafter_kv.py --device "$dev" --dtype "$dtype" --hidden "$hidden" --batch-sizes $RS_BATCHES \
        --contexts $RS_CONTEXTS --out "$work/realsize_drafter_kv.json"
}

rs_kernels() {  # per-kernel time of one AR step and one verify round of raw DFlash and DMTP, batch 1, context 256
    "$PY" tools/bench/profile_decode.py --target "$RS_DIR" --dtype bfloat16 $RS_DRAFTER \
        --methods ar,raw_dflash,dual_anchor_zero_init --batch-sizes 1 --contexts 256 --new-tokens 16 \
        --kernels 30 --kernel-rounds 8 --out "$work/realsize_kernels.json"
}

# realsize_train: the production trainer (FSDP, 1 device, bf16-mixed) at 8B shapes on "$RS_DIR": 20 steps of seq 2048 x
# batch 2 with 512 anchors and the experiment's 5-layer / 5-tap drafter, for DMTP and raw DFlash; s/step, tok/s, MFU
# with its FLOP count, peak memory, a checkpoint's stall (step 10), the run-end walk and the bf16 export, the step's
# time phase by phase (CUDA events), and the top kernels of 2 profiled steps (outside the timed median; Chrome traces in reports.tar.gz). Its run
# directories live in /dev/shm (checkpoints of ~13 GB). A call of its own: GPU_CHECK_STEPS="realsize_train".
RS_TRAIN_LIMIT=${GPU_REALSIZE_TRAIN_LIMIT:-300}
RS_TRAIN_ARGS="${GPU_REALSIZE_TRAIN_ARGS:-}"
realsize_train() {
    local dir; dir=$(dirname "$RS_DIR")
    # The drafter's training attention alone first (seconds): one dense mask against blocks attended in groups.
    if "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then   # a CPU rehearsal skips it
        "$PY" tools/micro/bench_block_attention.py --device cuda --dtype bfloat16 --out "$work/block_attention.json"
    fi
    "$PY" tools/bench/bench_train_scale.py --target "$RS_DIR" --steps 20 --checkpoint-every 10 --profile-steps 2 --workdir "$dir" \
        $RS_TRAIN_ARGS --out "$work/realsize_train.json"
}

export -f install probe build_target gpu_tests bench_decode bench_trained bench_peer pip_offline
# rs_data: capture and cache-fed training at 8B shapes (tools/bench/bench_data.py; its caches in a temporary DMTP_HOME
# under /tmp: ~1.6 GB of bf16 features for 32k tokens).
RS_DATA_LIMIT=${GPU_REALSIZE_DATA_LIMIT:-100}
rs_data() {
    "$PY" tools/bench/bench_data.py --target "$RS_DIR" --device cuda --skip-regen --rows 16 --seq-len 2048 --batch 2 \
        --steps 10 --out "$work/bench_data.json"
}


# ---- issue41: verify_length=auto's cost tables and the drafter's cost against context, at 8B shapes ------------
VL_SURVIVAL="${GPU_VL_SURVIVAL:-0.87 0.76 0.55 0.46 0.42 0.35 0.27}"   # the CPU run's survival EMA (BENCHMARKS.md)
LC_CONTEXTS="${GPU_LC_CONTEXTS:-2048 8192 32768 65536}"
LC_WINDOW="${GPU_LC_WINDOW:-2048}"
vl_tables() {
    "$PY" tools/bench/bench_verify_length.py --target "$RS_DIR" --random-dspark $RS_DRAFTER --random-block-size 8 \
        --dtype bfloat16 --cuda-graphs --tables-only --batch-sizes $RS_BATCHES --what-if $VL_SURVIVAL \
        --out "$work/verify_length_tables.json"
}
vl_trained() {   # a trained target's drafters: tau means something here
    local drafters=() d
    for d in "$WHEELS"/trained/drafters/*/; do drafters+=(--drafter "${d%/}"); done
    "$PY" tools/bench/bench_verify_length.py --target "$WHEELS/trained/target" "${drafters[@]}" --mtp415 --dtype float32 \
        --cuda-graphs --batch-sizes $RS_BATCHES --reps 2 --out "$work/verify_length_trained.json"
}
lc_context() {
    "$PY" tools/bench/bench_long_context.py --target "$RS_DIR" --random-drafters raw_dflash,dual_anchor_zero_init \
        $RS_DRAFTER --window "$LC_WINDOW" --dtype bfloat16 --cuda-graphs --contexts $LC_CONTEXTS --batch-sizes 1 \
        --rounds 8 --out "$work/long_context.json"
}

export -f rs_target rs_table rs_peer rs_context rs_kernels rs_attention realsize_train rs_data vl_tables vl_trained \
    lc_context
export PY WHEELS work out RS_DIR RS_SHAPE_ARGS RS_CONTEXTS RS_BATCHES RS_DRAFTER RS_TRAIN_ARGS VL_SURVIVAL LC_CONTEXTS \
    LC_WINDOW

# The limits add up to 500 s (under the 540 s call): install 60, probe 40, target 45, tests 170,
# bench 2 x 55, peer 75; plus trained 110 where carried (a 600 s call then). Typical times are far below; a
# hung step only costs its own limit.
# The console (the tool's output_tail) gets the gist; the files under $out have everything.
quiet() { grep -vE "Warning: |warnings.warn\(|_cpu_device_warning\(\)|^\s*$"; }
step install 60 install >"$out/install.log" 2>&1; grep -E "^== (python3|wheelhouse|not installed)|rc=" "$out/install.log"
if wants probe; then step probe 40 probe >"$out/probe.txt" 2>&1; quiet <"$out/probe.txt"; fi
if wants target; then step target 45 build_target 2>&1 | tail -2; fi
if wants tests; then
    step tests 170 gpu_tests >"$out/gpu_tests.txt" 2>&1
    grep -E "^(SKIPPED|FAILED|ERROR)|passed|failed|rc=" "$out/gpu_tests.txt" | tail -30
fi
# vLLM interop (tests/vllm_interop) only where a CUDA build of vLLM is installed (pip install -e ".[vllm]";
# the GPU image has none and no network): there hybrid targets are served (test_vllm_hybrid.py, which the
# CPU build cannot run) and DFlash2 goes through vLLM's own V2 runner. Appended to gpu_tests.txt (the device
# tool brings back at most 8 files).
if wants tests && "$PY" -c "import vllm" 2>/dev/null; then
    step vllm 120 "$PY" -m pytest -q tests/vllm_interop -p no:cacheprovider -rs >>"$out/gpu_tests.txt" 2>&1
    grep -E "passed|failed|rc=" "$out/gpu_tests.txt" | tail -3
fi
if wants bench; then
    { step bench_graphs 55 bench_decode ""; step bench_eager 55 bench_decode --no-cuda-graphs; } >"$out/bench_decode.txt" 2>&1
    quiet <"$out/bench_decode.txt" | grep -vE "^report written"
fi
if wants peer; then step peer 75 bench_peer >"$out/bench_peer.txt" 2>&1; quiet <"$out/bench_peer.txt" | grep -vE "^report written"; fi
if wants realsize || wants realsize_train; then
    # Limits (x SCALE): target 90, table 110, peer 100, context 110, kernels 70, attention 50: 530 s, so that install + realsize fit
    # one 600 s call (estimated ~390 s on an H200). The training has a call of its own: GPU_CHECK_STEPS="realsize_train" runs
    # the target (reused while the machine is warm) and the training only (limit RS_TRAIN_LIMIT). Without the target nothing
    # else can run; every other sub-step runs even if the one before failed.
    { step rs_target 90 rs_target && {
        if wants realsize; then
            step rs_table 110 rs_table; step rs_peer 100 rs_peer; step rs_context 110 rs_context
            step rs_kernels 70 rs_kernels; step rs_attention 50 rs_attention
        fi
        if wants realsize_train; then
            step rs_train "$RS_TRAIN_LIMIT" realsize_train; step rs_data "$RS_DATA_LIMIT" rs_data
        fi; }; } >"$out/realsize.txt" 2>&1
    # The console gets the tables but not the kernel lists (they are in realsize.txt): the call's tail is 12k characters.
    quiet <"$out/realsize.txt" | awk '/^kernels of/{skip=1} skip&&/^\| total/{skip=0; next} !skip' \
        | grep -vE "^report written|^\[random_target\] model-|Loading weights|USDT|profiler_st|gpuGetDeviceCount" | tail -120
fi
if wants issue41; then
    # Limits (x SCALE): target 90, tables 150, context 150, trained 120: 510 s with install, under one 600 s call.
    { step rs_target 90 rs_target && {
        step lc_context 150 lc_context; step vl_tables 150 vl_tables
        if [ -d "$WHEELS/trained/target" ]; then step vl_trained 120 vl_trained; fi; }; } >"$out/issue41.txt" 2>&1
    quiet <"$out/issue41.txt" | grep -vE "^report written|^\[random_target\] model-|Loading weights" | tail -80
fi
if wants trained && [ -d "$WHEELS/trained/target" ]; then   # last: the figures above come back even if it runs out
    step trained 110 bench_trained >>"$out/bench_peer.txt" 2>&1
    sed -n '/== bench_decode on the carried trained/,$p' "$out/bench_peer.txt" | quiet | grep -vE "^report written"
fi
tar -czf "$out/reports.tar.gz" -C "$work" . 2>/dev/null
failed=$(grep -E " rc=[1-9]" "$summary" | cut -d' ' -f1 | tr '\n' ' ')
echo "gpu_check done in $(( $(date +%s) - t_start )) s; failed steps: ${failed:-none}" | tee -a "$summary"
rm -rf "$work"
[ -z "$failed" ]
