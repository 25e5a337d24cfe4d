"""How the feature cache stores a hidden state: the codecs, their round trip, and their bytes.

A stored group is [tokens, G, H] (G vectors of width H per token: the drafter's G taps, or one MTP hidden).

  fp32, bf16, fp16  the values in that dtype (fp32 of an fp32 target: exact)
  fp8               e4m3 values with one fp32 scale per token and vector (absmax / 448), as vLLM speculators'
                    FP8 transfer keeps them (per-token scales)
  lowrank           the G*H values of a token projected on the top `rank` principal directions of the
                    cache's own features (a basis fitted once per cache, `fit_basis`), coefficients in fp8
                    with one scale per token: G*H -> rank + 4 bytes

`encode` -> {part name: tensor}; `decode` reads them back as floats. `vector_bytes` is the arithmetic.
"""
from __future__ import annotations

import torch

CODECS = ("fp32", "bf16", "fp16", "fp8", "lowrank")
_PLAIN = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def require_codec(codec: str, rank: int | None = None) -> None:
    if codec not in CODECS:
        raise ValueError(f"data.feature_codec must be one of {', '.join(CODECS)}, got {codec!r}")
    if codec == "lowrank" and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise ValueError(f"data.feature_codec=lowrank needs a rank >= 1 (data.feature_rank / "
                         f"data.feature_mtp_rank), got {rank!r}")


def _fp8(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """[..., D] -> e4m3 values and one fp32 scale per leading index."""
    scale = (x.abs().amax(-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return {"q": (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), "scale": scale[..., 0]}


def _unfp8(parts: dict) -> torch.Tensor:
    return parts["q"].float() * parts["scale"][..., None].float()


def encode(x: torch.Tensor, codec: str, basis: dict | None = None) -> dict[str, torch.Tensor]:
    """x [N, G, H] -> the stored parts (leading dim N everywhere, so rows can be sliced)."""
    if codec in _PLAIN:
        return {"v": x.to(_PLAIN[codec]).contiguous()}
    if codec == "fp8":
        return _fp8(x)
    flat = x.reshape(x.shape[0], -1).float()
    return _fp8((flat - basis["mean"]) @ basis["components"])


def decode(parts: dict, codec: str, basis: dict | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The stored parts of N tokens -> [N, G * H] in `dtype` (the layout the target's forward returns)."""
    if codec in _PLAIN:
        return parts["v"].reshape(parts["v"].shape[0], -1).to(dtype)
    if codec == "fp8":
        x = _unfp8(parts)
        return x.reshape(x.shape[0], -1).to(dtype)
    coeff = _unfp8(parts)
    return (basis["mean"] + coeff @ basis["components"].T).to(dtype)


def fit_basis(sample: torch.Tensor, rank: int) -> dict[str, torch.Tensor]:
    """Principal directions of sample [N, G, H] (concatenated per token): {"mean" [G*H], "components"
    [G*H, rank]} (orthonormal columns, largest variance first), from the covariance's eigenvectors."""
    flat = sample.reshape(sample.shape[0], -1).double()
    dim = flat.shape[1]
    if rank > dim:
        raise ValueError(f"data.feature_rank {rank} is above the features' width {dim}")
    mean = flat.mean(0)
    centred = flat - mean
    cov = centred.T @ centred / max(1, flat.shape[0] - 1)
    _, vectors = torch.linalg.eigh(cov)                       # ascending eigenvalues
    components = vectors[:, -rank:].flip(-1)
    return {"mean": mean.float().contiguous(), "components": components.float().contiguous()}


def vector_bytes(codec: str, groups: int, width: int, rank: int | None = None) -> int:
    """Bytes per token of G vectors of width H in `codec`."""
    if codec in _PLAIN:
        return groups * width * torch.finfo(_PLAIN[codec]).bits // 8
    if codec == "fp8":
        return groups * (width + 4)
    return rank + 4


__all__ = ["CODECS", "FP8", "decode", "encode", "fit_basis", "require_codec", "vector_bytes"]
