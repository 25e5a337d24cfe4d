#!/usr/bin/env bash
# The device checks, as one short script for a lent CUDA machine (run from the repo root):
#   bash tools/gpu_check.sh [OUT_DIR]
# 1. the GPU tests (CUDA graphs == eager tokens and acceptance, flash-attn path, sampling under graphs);
# 2. the side-by-side decoding benchmark on the embedded micro target with graphs on and off.
set -uo pipefail
out="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$out"
pip install -q -e ".[dev]" >"$out/pip.log" 2>&1 || { echo "pip install failed"; tail -5 "$out/pip.log"; exit 1; }
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$out/device.txt"
python -c "import flash_attn; print('flash-attn', flash_attn.__version__)" 2>/dev/null | tee -a "$out/device.txt" || echo "flash-attn not installed" | tee -a "$out/device.txt"
python -m pytest -q -m gpu tests 2>&1 | tee "$out/gpu_tests.txt" | tail -15
for graphs in "" "--no-cuda-graphs"; do
  python tools/bench_decode.py --preset micro --random-drafters raw_dflash,dual_anchor_zero_init \
      --num-prompts 8 --max-new-tokens 64 --batch-size 8 $graphs --out "$out/bench${graphs:+_eager}.json" \
      2>&1 | grep -v "it/s\]" | tail -12 | tee "$out/bench${graphs:+_eager}.txt"
done
# 3. vLLM interop (tests/vllm_interop), where a CUDA build of vLLM is installed (pip install -e ".[vllm]"):
#    there DFlash2 exports are served (V2 model runner) instead of refused as on the CPU build.
if python -c "import vllm" 2>/dev/null; then
  python -m pytest -q tests/vllm_interop 2>&1 | tee "$out/vllm_tests.txt" | tail -15
else
  echo "vLLM not installed: tests/vllm_interop not run" | tee "$out/vllm_tests.txt"
fi
