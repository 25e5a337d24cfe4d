"""Models: the target runtime (target.py, qwen3.py, gated_deltanet.py, mla.py, moe.py), the native MTP module
and its checkpoint tensors (mtp.py, mtp_checkpoint.py, mtp_chain.py), and the readers every layer shares
(rope_config.py, safe_weights.py, provenance.py, model_card.py).

Each target family's MTP block is in dmtp/families/, each drafter architecture in dmtp/drafters/."""
