"""What an offline feature cache holds (`FeatureSpec`) and what it costs per token (`token_bytes`).

One capture stores, for every token of the training rows, what the drafter reads from its target:
- the context features at the drafter's taps (`layer_ids`, concatenated as the target's forward returns them);
- the MTP's teacher-forced hidden at every position (`mtp_hidden`: T1's hidden and the context variants'
  per-position MTP feature; every DMTP variant reads it);
- the target's post-norm last hidden (`last_hidden`: the MTP's input, for the multi-step chain of
  `multi_mtp_zero_init` and for a jointly trained MTP, which recompute their MTP passes from it);
- the labels of `labels`: `greedy` (the target's argmax, model.label_source=target) or `topk` (also its
  distribution as the `top_k` largest probabilities and the tail mass, for KL / TV losses), or `none`
  (model.label_source=data with a CE loss).

Features are stored by `codec` (dmtp.datagen.feature_codecs); `rank` / `mtp_rank` are the lowrank codec's
coefficients for the taps and for each single hidden (MTP, last). `dtype` is the target's: features read back
in it, as the online forward gives them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from dmtp.datagen.feature_codecs import require_codec, vector_bytes

LABELS = ("none", "greedy", "topk")
DTYPE_CODECS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class FeatureSpec:
    layer_ids: tuple[int, ...]
    codec: str = "bf16"
    rank: int | None = None
    mtp_rank: int | None = None
    mtp_hidden: bool = True
    last_hidden: bool = False
    labels: str = "greedy"
    top_k: int = 32
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "layer_ids", tuple(int(i) for i in self.layer_ids))
        require_codec(self.codec, self.rank)
        if self.codec == "lowrank" and (self.mtp_hidden or self.last_hidden):
            require_codec(self.codec, self.mtp_rank)
        if self.labels not in LABELS:
            raise ValueError(f"data.feature_labels must be one of {', '.join(LABELS)}, got {self.labels!r}")
        if self.labels == "topk" and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"data.feature_top_k must be an integer >= 1, got {self.top_k!r}")
        if self.dtype not in DTYPE_CODECS:
            raise ValueError(f"feature cache dtype must be one of {', '.join(DTYPE_CODECS)}, got {self.dtype!r}")
        if not self.layer_ids:
            raise ValueError("a feature cache needs at least one tapped layer")

    @property
    def taps(self) -> int:
        return len(self.layer_ids)

    def key(self) -> dict:
        """What changes the stored bytes (the key of the cache directory)."""
        d = asdict(self)
        if self.codec != "lowrank":
            d.pop("rank"), d.pop("mtp_rank")
        if self.labels != "topk":
            d.pop("top_k")
        return d

    def held_out(self) -> "FeatureSpec":
        """The validation rows' spec: the target's own precision (the walk measures what decoding will see),
        the last hidden kept wherever the MTP is (the walk chains the MTP from it)."""
        return replace(self, codec=DTYPE_CODECS[self.dtype], rank=None, mtp_rank=None,
                       last_hidden=self.last_hidden or self.mtp_hidden)

    def token_bytes(self, hidden: int, vocab: int | None = None) -> dict[str, int]:
        """Bytes per token, part by part (the ids and loss mask included), and their total."""
        single = self.mtp_rank
        parts = {"taps": vector_bytes(self.codec, self.taps, hidden, self.rank)}
        if self.mtp_hidden:
            parts["mtp_hidden"] = vector_bytes(self.codec, 1, hidden, single)
        if self.last_hidden:
            parts["last_hidden"] = vector_bytes(self.codec, 1, hidden, single)
        if self.labels != "none":
            parts["greedy"] = 4
        if self.labels == "topk":
            parts["topk"] = self.top_k * (4 + 2) + 4     # int32 ids, fp16 probabilities, fp32 tail mass
        parts["ids+mask"] = 5
        parts["total"] = sum(parts.values())
        return parts

    def describe(self) -> str:
        codec = f"lowrank r={self.rank}" + (f"/{self.mtp_rank}" if self.mtp_hidden or self.last_hidden else "") \
            if self.codec == "lowrank" else self.codec
        items = [f"{self.taps} tap{'s' if self.taps > 1 else ''}"] + (["MTP hidden"] if self.mtp_hidden else []) + \
            (["last hidden"] if self.last_hidden else [])
        labels = {"none": "no labels", "greedy": "greedy labels", "topk": f"greedy + top-{self.top_k} labels"}
        return f"{' + '.join(items)} in {codec}, {labels[self.labels]}"


def deepspec_token_bytes(hidden: int, taps: int = 5) -> int:
    """DeepSpec's offline cache per token: bf16 hidden states of `taps` layers plus the last hidden."""
    return (taps + 1) * hidden * 2


__all__ = ["DTYPE_CODECS", "FeatureSpec", "LABELS", "deepspec_token_bytes"]
