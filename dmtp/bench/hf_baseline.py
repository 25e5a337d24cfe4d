"""transformers' own greedy generate() on the same target and prompts: the baseline dmtp's AR runner is
timed against."""
from __future__ import annotations

import time

import torch

from dmtp.decode.metrics import throughput


@torch.no_grad()
def hf_generate(target, prompts, max_new_tokens: int, batch_size: int, eos: int | None) -> dict:
    """transformers' own greedy generate(), left-padded batches; throughput incl. prefill."""
    hf, dev = target.hf, target.device
    pad = eos if eos is not None else 0
    outputs = []
    # warm-up
    hf.generate(torch.tensor([prompts[0]], device=dev), max_new_tokens=4, do_sample=False, pad_token_id=pad,
                eos_token_id=eos)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for s in range(0, len(prompts), batch_size):
        chunk = prompts[s:s + batch_size]
        t = max(map(len, chunk))
        ids = torch.full((len(chunk), t), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), t), dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, t - len(p):] = torch.tensor(p)
            mask[i, t - len(p):] = 1
        out = hf.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new_tokens, do_sample=False,
                          pad_token_id=pad, eos_token_id=eos)
        for row in out[:, t:].tolist():
            if eos is not None and eos in row:
                row = row[: row.index(eos) + 1]
            outputs.append(row)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t0
    n = sum(len(o) for o in outputs)
    return {"tokens": outputs, "output_tokens": n, "wall_s": wall, "tokens_per_s": throughput(n, wall)}
