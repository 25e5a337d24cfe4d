"""Target families: each one's native MTP block and static-cache runner, registered once.

base.py         `Family`: its model types, MTP layout, MTP spec and block, runner, micro target and test
catalogue.py    the one list (`FAMILIES`, tried in order); lookup by model_type; which runner drives a
                target (`make_target_runner`: a family's runner, else the exact recompute oracle)
mtp_loading.py  `load_native_mtp`: a checkpoint's MTP, built by its family and loaded strictly
decoding.py     the one loop on a target: `spec_decoder` (its runner from the catalogue), `build_decoder`
dense.py        Qwen3 / Qwen2 / Llama / Mistral (Qwen3 MTP block)
hybrid.py       Qwen3-Next / Qwen3.5 / Qwen3.6 (gated DeltaNet + gated attention)
deepseek_v3.py  DeepSeek-V3 (MLA, sigmoid MoE)
glm4_moe.py     GLM-4-MoE (GLM-4.5 / 4.6 / 4.7)
"""
