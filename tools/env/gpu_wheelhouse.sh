#!/usr/bin/env bash
# The wheels that tools/env/gpu_check.sh installs on a lent GPU machine, which has no network. Run HERE
# (with PyPI reachable), from the repo root, before the GPU call:
#   bash tools/env/gpu_wheelhouse.sh [DIR]        # DIR defaults to gpu_wheels/ (ignored by git)
# then name DIR in the call's `carry` (BENCHMARKS.md, "GPU day").
#
# Target: the GPU image's python3, CPython 3.12 (3.12.3 at /opt/torch/.venv, as sessions saw it in 2026-11;
# /work/.library/device/KINDS.md), x86_64 manylinux. The image already holds torch 2.11 (CUDA 13),
# triton, lightning, transformers, safetensors, tensorboard, numpy, pyyaml, einops, scipy, pytest,
# pytest-timeout (KINDS.md's package list of 2026-11-17).
#
# What it LACKS and the check needs (all pure Python):
#   hydra-core, omegaconf, antlr4-python3-runtime  the configs; tests import hydra at collection.
#                                                   antlr4 4.9.3 (omegaconf pins 4.9.*) is an sdist
#                                                   only: built into a py3-none-any wheel here.
#   flash-linear-attention + fla-core               the Gated DeltaNet Triton kernels (hybrid runner).
#   dflash==0.1.0                                   the reference loop for tools/bench/bench_peer.py and the
#                                                   interop tests; installed --no-deps: its pins (tqdm,
#                                                   datasets, requests) serve its own CLI benchmark,
#                                                   and dflash.model imports only torch + transformers.
#   setuptools, wheel                               the build backend of `pip install -e .` offline.
# Fallbacks, in the image already (pip leaves an installed one alone): carried so that a changed image,
# and the rehearsal virtualenv that has only torch/lightning/transformers/safetensors/tensorboard, still
# run the check: pytest (+pluggy, iniconfig, pygments), pytest-timeout, einops, scipy (the tests'
# chi-square p-values; the largest wheel here, ~35 MB).
# Plus dmtp_home/: the built micro target (below).
# Optional, trained/: a trained target and its drafters for gpu_check.sh's `trained` step (tau means something
# there, unlike the micro target's random drafters), copied from
#   GPU_TRAINED_TARGET=<target dir> GPU_TRAINED_DRAFTERS="<drafter dir> <drafter dir> ..." (the embedded tiny
#   target and its quick-start drafters are ~3.6 MB together).
#
# NOT carried:
#   flash-attn, causal-conv1d  PyPI has sources only; they compile CUDA extensions against the local
#                              torch (flash-attn: far longer than the whole GPU lease), and their
#                              prebuilt release wheels live on GitHub, which is unreachable from here.
#                              Without causal-conv1d the hybrid runner's kernel path (dmtp.models.
#                              gdn_kernels needs both fla and causal-conv1d) stays on plain torch and its
#                              kernel test skips; gpu_check.sh reports which kernels it ran with.
#   datasets (+ pyarrow, dill, multiprocess, xxhash)  dmtp imports `datasets` lazily, only for Hub
#                              datasets and save_to_disk folders; the check reads neither.
set -euo pipefail
dir="${1:-gpu_wheels}"
mkdir -p "$dir"
plat=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
need=(hydra-core==1.3.8 omegaconf==2.3.1 flash-linear-attention==0.6.0 fla-core==0.6.0 dflash==0.1.0
      setuptools==84.2.1 wheel==0.48.0)
fallback=(pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 packaging==26.4 pytest-timeout==2.4.0 einops==0.8.2
          scipy==1.18.1)
python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d "$dir" "${need[@]}" "${fallback[@]}"
# antlr4-python3-runtime 4.9.3 has no wheel on PyPI: build the pure-Python one here.
ls "$dir"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1 ||
    python3 -m pip wheel -q --no-deps -w "$dir" antlr4-python3-runtime==4.9.3
# The embedded micro target the tests and benchmarks decode with (~1.3 MB): built here once (or taken from
# this machine's cache), so that the lease does not spend its minutes building it. Its directory name is
# the preset's cache key: gpu_check.sh uses the copy only while the checkout's preset still matches it.
rm -rf "$dir/dmtp_home"
micro=$(PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 -c \
    "from dmtp.tiny.targets import ensure_tiny_target; print(ensure_tiny_target('micro', progress=False))" | tail -1)
mkdir -p "$dir/dmtp_home/targets" && cp -r "$micro" "$dir/dmtp_home/targets/"
rm -rf "$dir/trained"
if [ -n "${GPU_TRAINED_TARGET:-}" ]; then
    mkdir -p "$dir/trained/drafters" && cp -r "$GPU_TRAINED_TARGET" "$dir/trained/target"
    i=0; for d in ${GPU_TRAINED_DRAFTERS:-}; do i=$((i + 1)); cp -r "$d" "$dir/trained/drafters/$i"; done
    ls "$dir/trained/drafters"
fi
ls -l "$dir" "$dir/dmtp_home/targets"
du -sh "$dir"
