"""What a drafter trained from cached features reads of its target: the config, the input embedding and the
LM head, and nothing else (`TargetHead`).

The decoder is never loaded, so a 397B target costs its embedding and head (2 x vocab x hidden values), not its
weights; asking it for a forward is an error.

The tensors are read strictly from the checkpoint's safetensors (`model.safetensors` or its index): the one
`*embed_tokens.weight` outside the MTP, and `lm_head.weight` unless the config ties it to the embedding.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig

from dmtp.models.mtp_checkpoint import CheckpointIndex
from dmtp.models.safe_weights import require_safetensors
from dmtp.models.target import resolve_target_path


class TargetHead(nn.Module):
    """The target's `embed_tokens` and `lm_head` (frozen), its `config`, `path`, `num_layers` and
    `hidden_size`, as `dmtp.models.target.TargetModel` has them; no decoder."""

    def __init__(self, config, embedding: torch.Tensor, head: torch.Tensor | None, path: str = ""):
        super().__init__()
        self.path = path
        self.config = getattr(config, "text_config", None) or config
        self.num_layers = self.config.num_hidden_layers
        self.hidden_size = self.config.hidden_size
        vocab, width = embedding.shape
        self._embed = nn.Embedding(vocab, width, _weight=embedding, _freeze=True)
        self._head = nn.Linear(width, vocab, bias=False, device="meta")   # no init: the run's RNG is left as a
        # whole target's loading leaves it (the drafter built next draws the same initial weights)
        self._head.weight = self._embed.weight if head is None else nn.Parameter(head, requires_grad=False)
        self.requires_grad_(False).eval()

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                        trust_remote_code: bool = False) -> "TargetHead":
        resolved = resolve_target_path(path)
        if not Path(resolved).is_dir():
            raise ValueError(f"training from cached features reads the target's embedding and LM head from a local "
                             f"checkpoint directory; {resolved!r} is not one")
        require_safetensors(resolved)
        config = AutoConfig.from_pretrained(resolved, trust_remote_code=trust_remote_code)
        text = getattr(config, "text_config", None) or config
        index = CheckpointIndex(resolved)
        keys = [k for k in index.keys() if k not in index.mtp_only_keys and not k.startswith("mtp.")]
        embedding = _one(keys, "embed_tokens.weight", resolved)
        tied = bool(getattr(config, "tie_word_embeddings", False) or getattr(text, "tie_word_embeddings", False))
        head = None if tied else _one(keys, "lm_head.weight", resolved)

        def load(key):
            return index.get(key).to(device=device, dtype=dtype)

        return cls(config, load(embedding), None if head is None else load(head), resolved)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._embed

    @property
    def lm_head(self) -> nn.Linear:
        return self._head

    @property
    def device(self) -> torch.device:
        return self._embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self._embed.weight.dtype

    def decoder_layers(self) -> list[nn.Module]:
        """None: the decoder is not loaded (nothing to shard)."""
        return []

    def check_layer_ids(self, layer_ids) -> None:
        bad = [l for l in layer_ids if not 0 <= l < self.num_layers]
        if bad:
            raise ValueError(f"target_layer_ids {list(layer_ids)} out of range for a {self.num_layers}-layer target")

    def forward(self, *args, **kwargs):
        raise ValueError(f"the target's decoder is not loaded (training from cached features: only the embedding and "
                         f"LM head of {self.path} are); this step needs the whole target")


def _one(keys: list[str], suffix: str, where: str) -> str:
    found = [k for k in keys if k == suffix or k.endswith("." + suffix)]
    if len(found) != 1:
        raise ValueError(f"{where}: expected one '*{suffix}' tensor in the checkpoint, found "
                         f"{found[:4] if found else 'none'}")
    return found[0]


__all__ = ["TargetHead"]
