"""The frozen target model: any local Hugging Face causal LM (or a hub id where the network allows).

One call gives what both drafters need:
- logits,
- `layer_hidden`: the concatenated outputs of decoder layers `target_layer_ids` (DFlash convention:
  `hidden_states[l + 1]`, the embedding output being entry 0),
- `last_hidden`: the last hidden state after the final norm (what a native MTP consumes).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from dmtp.models.safe_weights import first_unreadable, require_safetensors, unreadable


@dataclass
class TargetOutput:
    logits: torch.Tensor        # [B, T, V]
    layer_hidden: torch.Tensor  # [B, T, len(layer_ids) * H]
    last_hidden: torch.Tensor   # [B, T, H], post final norm


def resolve_target_path(path: str | Path) -> str:
    """A local checkpoint directory, or a hub id (only when no such local path exists)."""
    p = Path(path).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise FileNotFoundError(f"target checkpoint {p} has no config.json")
        return str(p)
    if str(path).startswith((".", "/", "~")) or str(path).count("/") != 1:
        raise FileNotFoundError(f"target checkpoint not found: {path}")
    return str(path)  # looks like a hub id; transformers resolves it where the network allows


def read_config_dict(path: str | Path) -> dict:
    p = Path(path)
    if p.is_dir():
        return json.loads((p / "config.json").read_text())
    return AutoConfig.from_pretrained(str(path)).to_dict()


class TargetModel(nn.Module):
    """Frozen, eval-mode wrapper; `hf` is the transformers model."""

    def __init__(self, hf_model: nn.Module, path: str = ""):
        super().__init__()
        self.hf = hf_model.eval().requires_grad_(False)
        self.path = path
        config = hf_model.config
        self.config = getattr(config, "text_config", None) or config
        self.num_layers = self.config.num_hidden_layers
        self.hidden_size = self.config.hidden_size

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                        trust_remote_code: bool = False, attn_implementation: str | None = "sdpa") -> "TargetModel":
        resolved = resolve_target_path(path)
        kwargs = {"dtype": dtype, "trust_remote_code": trust_remote_code}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        local = Path(resolved).is_dir()
        if local:   # safetensors only: a pickled pytorch_model.bin from a user's path is never read
            require_safetensors(resolved)
            kwargs["use_safetensors"] = True
        try:
            with _quiet_transformers():
                # The checkpoint's own `mtp.*` tensors are not part of the causal LM; the MTP loader
                # reads them separately, so transformers' "unexpected keys" report is noise here.
                hf = AutoModelForCausalLM.from_pretrained(resolved, **kwargs)
        except SafetensorError as e:
            raise unreadable((first_unreadable(resolved) if local else None) or resolved, e) from None
        return cls(hf.to(device), resolved)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.hf.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.hf.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def decoder_layers(self) -> list[nn.Module]:
        """The transformer blocks, in order (the units a sharded frozen target is split into)."""
        return list(self.hf.get_decoder().layers)

    def check_layer_ids(self, layer_ids) -> None:
        bad = [l for l in layer_ids if not 0 <= l < self.num_layers]
        if bad:
            raise ValueError(f"target_layer_ids {list(layer_ids)} out of range for a {self.num_layers}-layer target")

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, layer_ids=(), attention_mask: torch.Tensor | None = None,
                logits: bool = True) -> TargetOutput:
        """`logits=False`: the decoder alone, no LM head (its logits are None): at a 151k vocabulary the head is
        ~5 TFLOP and ~1.2 GB per 4k tokens that a loss on the data tokens never reads."""
        self.check_layer_ids(layer_ids)
        model = self.hf if logits else self.hf.get_decoder()
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        last = hs[-1]  # transformers stores the final-norm output as the last entry
        layer_hidden = torch.cat([hs[l + 1] for l in layer_ids], dim=-1) if layer_ids else last[..., :0]
        return TargetOutput(out.logits if logits else None, layer_hidden, last)


@contextmanager
def _quiet_transformers():
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    return AutoTokenizer.from_pretrained(resolve_target_path(path), trust_remote_code=trust_remote_code)
