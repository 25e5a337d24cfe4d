"""Serving what dmtp trains through vLLM (optional: vLLM lives in its own environment, see README).

vllm_engine.py  the one place vLLM is imported and an engine is built (engine options passed through),
                prompts and sampling mapped to vLLM's, and its speculative-decoding counters read back
regen_vllm.py   the target writes its training data through vLLM's offline batch API
                (`data.regen_engine=vllm`), shard for shard what dmtp's own regeneration writes
"""
