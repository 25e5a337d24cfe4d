"""Serving what dmtp trains through vLLM (optional: vLLM lives in its own environment, see README).

Nothing here imports vLLM at module level, so the package loads where vLLM is not installed.

adapter.py            vLLM as a dmtp engine (dmtp.serving.catalogue): its decoders and regeneration writer
engine.py             an engine built for dmtp (engine options passed through), prompts and sampling mapped
                      to vLLM's, and its speculative-decoding counters read back
decoder.py            `python -m dmtp.infer engine=vllm`: dmtp's methods decoded inside vLLM
regen.py              the target writes its training data through vLLM's offline batch API
                      (`data.regen_engine=vllm`), shard for shard what dmtp's own regeneration writes
plugin.py             the plug-in vLLM loads in every process (entry point `vllm.general_plugins: dmtp`)
plugin_model.py       the DMTP drafter model vLLM builds (DFlash's, plus the injection and the native MTP)
plugin_proposer.py    DMTP's round inside vLLM: the MTP's T1 in the DFlash block
dflash2_proposer.py   DFlash2's candidate-selector walk on vLLM's V1 runner
refused.py            the exports the plug-in refuses by architecture (DMTP + DSpark heads), with the reason
cpu_fixes.py          two corrections to vLLM 0.32's CPU kernels, installed by the plug-in
mtp_slots.py          the MTP's KV cache for every live request, caught up in one forward (no vLLM import)
"""
