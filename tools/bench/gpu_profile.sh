#!/usr/bin/env bash
# The 8B speed profile on a lent GPU (issue 64, item 4): one prepared call, no network on the machine.
# Here first, with PyPI reachable:   bash tools/env/gpu_wheelhouse.sh          (-> gpu_wheels/, ignored by git)
# Then, on the machine:              run(command="bash tools/bench/gpu_profile.sh", carry=["gpu_wheels"], timeout_s=540)
#
# Steps (each under its own timeout; summary.txt has rc and seconds per step):
#   install  hydra-core, omegaconf, antlr4 from the wheelhouse, offline (what the GPU image lacks to import dmtp),
#            and the project itself --no-deps -e . (PYTHONPATH=. serves either way)
#   target   a Qwen3-8B-shaped random target with its MTP, drawn on the GPU into /dev/shm (dmtp.tiny.random_target,
#            ~45 s on an H200; kept for a rerun while the machine is warm)
#   profile  python -m dmtp.bench.speed_profile at that target: every stage of a round (verify of 1..16 rows, the
#            MTP's step, catch-up and correction, the LM head full and over 4k..64k draft tokens, the slot builds,
#            random DFlash / DSpark / DFlash2 drafters at blocks 8 and 16: per layer, per tap, the heads), each a
#            CUDA graph, 15 interleaved reps, the fastest kept; whole rounds of ar, mtp415, mtp:7, raw DFlash and
#            DMTP as the check; batch 1 and 32, context 256, bf16
# Output ($OUT, else $1, else gpu_profile_out/): summary.txt, profile.txt (the command's output), profiles/
#   qwen3-8b.<gpu>.bf16.b1.json and .b32.json. To ship them: copy into dmtp/speed/profiles/ and make them the
#   default (DEFAULT_PROFILE in dmtp/speed/profile.py, speed_profile in conf/infer.yaml and conf/train.yaml),
#   and write every figure into BENCHMARKS.md with the device.
# Knobs: GPU_PROFILE_BATCHES ("1 32"), GPU_PROFILE_BLOCKS ("8 16"), GPU_PROFILE_REPS (15), GPU_PROFILE_CONTEXT (256),
#   GPU_PROFILE_SHAPE_ARGS (extra speed_profile options, e.g. "--tiny" for the CPU rehearsal), GPU_PROFILE_DIR
#   (/dev/shm/dmtp-speed-qwen3-8b), GPU_PROFILE_TIME_SCALE (stretches every timeout: a CPU rehearsal), PYTHON,
#   GPU_WHEELS (default gpu_wheels).
# Rehearsed on the CPU at the small shape:
#   GPU_PROFILE_SHAPE_ARGS="--tiny --device cpu --dtype float32" GPU_PROFILE_REPS=3 GPU_PROFILE_TIME_SCALE=3 \
#       GPU_PROFILE_DIR=/tmp/dmtp-speed-tiny bash tools/bench/gpu_profile.sh /tmp/gpu_profile_rehearsal
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-${1:-gpu_profile_out}}"
mkdir -p "$out/profiles"
out="$(cd "$out" && pwd)"
PY="${PYTHON:-python3}"
WHEELS="$(cd "${GPU_WHEELS:-gpu_wheels}" 2>/dev/null && pwd || echo "${GPU_WHEELS:-gpu_wheels}")"
SCALE="${GPU_PROFILE_TIME_SCALE:-1}"
TARGET_DIR="${GPU_PROFILE_DIR:-/dev/shm/dmtp-speed-qwen3-8b}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1
summary="$out/summary.txt"
echo "gpu_profile $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(date -u +%FT%TZ)" | tee "$summary"

step() {   # step NAME SECONDS CMD...: CMD under `timeout` (SECONDS x SCALE); "NAME rc=.. s=.." to summary.txt
    local name=$1 limit=$(( $2 * SCALE )); shift 2
    local t0=$(date +%s)
    timeout -k 10 "$limit" "$@"
    local rc=$?
    local note=""; { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && note=" (timed out at ${limit}s)"
    echo "$name rc=$rc s=$(( $(date +%s) - t0 ))$note" | tee -a "$summary"
    return $rc
}

install() {
    if "$PY" -c "import omegaconf, hydra" 2>/dev/null; then echo "== hydra-core and omegaconf already there"; else
        local unset=() v
        for v in $(compgen -e | grep '^PIP_'); do unset+=(-u "$v"); done
        env "${unset[@]}" PIP_CONFIG_FILE=/dev/null "$PY" -m pip --isolated install -q --no-index \
            --find-links "$WHEELS" --no-cache-dir --no-compile --disable-pip-version-check \
            hydra-core omegaconf antlr4-python3-runtime || return 1
    fi
    "$PY" -c "import dmtp.bench.speed_profile" && echo "== dmtp imports"
}

target() {
    if [ -f "$TARGET_DIR/config.json" ]; then echo "== $TARGET_DIR kept from an earlier call"; return 0; fi
    "$PY" -c "
import sys
from dmtp.bench.speed_profile import shipped_tokenizer
from dmtp.tiny.random_target import write_random_target
tiny = '--tiny' in sys.argv[2:]
dev = 'cpu' if '--device cpu' in ' '.join(sys.argv[2:]) else 'auto'
write_random_target('qwen3-8b', sys.argv[1], tiny=tiny, device=dev,
                    dtype='float32' if 'float32' in ' '.join(sys.argv[2:]) else 'bfloat16', tokenizer=shipped_tokenizer())
" "$TARGET_DIR" ${GPU_PROFILE_SHAPE_ARGS:-}
}

profile() {
    local extra=(${GPU_PROFILE_SHAPE_ARGS:-})
    local filtered=()
    for a in "${extra[@]}"; do [ "$a" = "--tiny" ] && continue; filtered+=("$a"); done   # the target is written
    "$PY" -m dmtp.bench.speed_profile --target "$TARGET_DIR" \
        --batch ${GPU_PROFILE_BATCHES:-1 32} --blocks ${GPU_PROFILE_BLOCKS:-8 16} \
        --reps "${GPU_PROFILE_REPS:-15}" --context "${GPU_PROFILE_CONTEXT:-256}" --out "$out/profiles" \
        "${filtered[@]}" 2>&1 | tee "$out/profile.txt"
    return "${PIPESTATUS[0]}"
}

step install 120 bash -c "$(declare -f install); PY='$PY' WHEELS='$WHEELS' install" > "$out/install.log" 2>&1
step target 150 bash -c "$(declare -f target); PY='$PY' TARGET_DIR='$TARGET_DIR' GPU_PROFILE_SHAPE_ARGS='${GPU_PROFILE_SHAPE_ARGS:-}' target" \
    > "$out/target.log" 2>&1
step profile 300 bash -c "$(declare -f profile); PY='$PY' TARGET_DIR='$TARGET_DIR' out='$out' \
    GPU_PROFILE_SHAPE_ARGS='${GPU_PROFILE_SHAPE_ARGS:-}' GPU_PROFILE_BATCHES='${GPU_PROFILE_BATCHES:-1 32}' \
    GPU_PROFILE_BLOCKS='${GPU_PROFILE_BLOCKS:-8 16}' GPU_PROFILE_REPS='${GPU_PROFILE_REPS:-15}' \
    GPU_PROFILE_CONTEXT='${GPU_PROFILE_CONTEXT:-256}' profile"
ls -la "$out/profiles" | tee -a "$summary"
