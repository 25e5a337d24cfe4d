"""A reduced draft vocabulary: the drafters' LM head over the V most frequent target tokens of the drafter's data
(EAGLE-3's draft vocabulary, FR-Spec), for the MTP's chained steps and the block drafter's slots.

An MTP step at a real shape reads the target's whole LM head (Qwen3-8B: 4096 x 151936, 1.24 GB of bf16) to
propose one token; a head over V of those rows reads V / vocab of it. The proposal is then restricted to the V
tokens: its logits are computed for them alone and put back into a full-vocabulary row that holds -inf
everywhere else (`DraftVocab.logits`), so every caller (argmax, the samplers, top-k/top-p, the Markov bias,
DFlash2's top-K) reads a distribution q that is the full one renormalised over the V tokens, zero outside.

Lossless in every verification mode: greedy and target-only verification compare the drafts with the target's
own tokens (a draft restricted to V just proposes within V); rejection and block verification weigh each draft
by the q it was drawn from, which is exact for any q (tests/test_speed_draft_vocab.py checks the output
distribution with a chi-square test).

Which V tokens: the most frequent supervised tokens of the drafter's training rows (`token_counts`), saved
beside the drafter as `draft_vocab/token_counts.safetensors` (`save_token_counts`; every V is then chosen at decoding
time). `python -m dmtp.training.draft_vocab <drafter dir>` counts them for a drafter trained before this file
existed, from the data its recorded training config names (the regeneration is read from the cache)."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

# In a folder of its own: engines load every *.safetensors at the top of a drafter's directory as its weights
COUNTS_NAME = "draft_vocab/token_counts.safetensors"


def token_counts(rows, vocab_size: int) -> torch.Tensor:
    """How often each token id is a supervised label of `rows` (dicts with input_ids and loss_mask, the drafter's
    training rows) -> int64 [vocab_size]."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for row in rows:
        ids = torch.as_tensor(row["input_ids"], dtype=torch.long)
        mask = torch.as_tensor(row["loss_mask"], dtype=torch.bool)
        labels = ids[mask]
        if labels.numel() and int(labels.max()) >= vocab_size:
            raise ValueError(f"token id {int(labels.max())} in the drafter's data is outside the vocabulary of "
                             f"{vocab_size}")
        counts += torch.bincount(labels, minlength=vocab_size)
    return counts


def save_token_counts(directory: str | Path, counts: torch.Tensor, source: str) -> Path:
    """`counts` [vocab] as `<directory>/draft_vocab/token_counts.safetensors` (with where they came from in its metadata)."""
    from dmtp.atomic_io import save_safetensors

    path = Path(directory) / COUNTS_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors(path, {"token_counts": counts.to(torch.int64).contiguous()}, metadata={"source": source})
    return path


def load_token_counts(path: str | Path) -> torch.Tensor:
    """The counts of a drafter directory (its draft_vocab/token_counts.safetensors) or of that file itself."""
    from safetensors.torch import load_file

    path = Path(path)
    file = path / COUNTS_NAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no draft-vocabulary token counts (a drafter trained with this version of "
                                f"dmtp writes them; for an older one: python -m dmtp.training.draft_vocab {path})")
    return load_file(str(file))["token_counts"]


class DraftVocab:
    """The V token ids a drafter proposes from (sorted), of a `vocab_size` vocabulary."""

    def __init__(self, ids: torch.Tensor, vocab_size: int):
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        if ids.numel() < 1:
            raise ValueError("a draft vocabulary needs at least one token")
        ids = torch.unique(ids)   # sorted, each once
        if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
            raise ValueError(f"draft vocabulary ids must lie in 0..{vocab_size - 1}")
        self.ids = ids
        self.vocab_size = int(vocab_size)
        self._rows: dict = {}
        self._ids: dict = {}

    @classmethod
    def most_frequent(cls, counts: torch.Tensor, size: int) -> "DraftVocab":
        """The `size` most frequent ids of `counts` [vocab] (ties: the lower id first)."""
        vocab = counts.numel()
        if type(size) is not int or not 1 <= size <= vocab:
            raise ValueError(f"draft_vocab must be an integer in 1..{vocab} (the target's vocabulary), got {size!r}")
        order = torch.argsort(counts.to(torch.int64), descending=True, stable=True)
        return cls(order[:size], vocab)

    @property
    def size(self) -> int:
        return self.ids.numel()

    def coverage(self, counts: torch.Tensor) -> float:
        """The share of the counted tokens inside this vocabulary."""
        total = int(counts.sum())
        return float(counts[self.ids].sum()) / total if total else float("nan")

    def rows(self, weight: torch.Tensor) -> torch.Tensor:
        """`weight`'s rows of the V ids [V, H], gathered once per weight (device and dtype) and kept: the head a
        step reads."""
        key = (weight.data_ptr(), weight.device, weight.dtype, tuple(weight.shape))
        rows = self._rows.get(key)
        if rows is None:
            if weight.shape[0] != self.vocab_size:
                raise ValueError(f"the draft vocabulary is of a {self.vocab_size}-token vocabulary, the LM head has "
                                 f"{weight.shape[0]} rows")
            rows = self._rows[key] = weight.detach().index_select(0, self.ids_on(weight.device)).contiguous()
        return rows

    def ids_on(self, device) -> torch.Tensor:
        """The ids on `device`, copied there once (no host copy inside a captured round)."""
        device = torch.device(device)
        if device not in self._ids:
            self._ids[device] = self.ids.to(device)
        return self._ids[device]

    def linear(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The head over the V rows: hidden [..., H] -> [..., V]."""
        return F.linear(hidden, self.rows(weight))

    def expand(self, reduced: torch.Tensor) -> torch.Tensor:
        """[..., V] logits -> the full vocabulary's [..., vocab], -inf outside the V ids (q = 0 there)."""
        ids = self.ids_on(reduced.device)
        out = reduced.new_full((*reduced.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(out.dim() - 1, ids, reduced)

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The restricted head as full-vocabulary logits: hidden [..., H] -> [..., vocab]."""
        return self.expand(self.linear(hidden, weight))

    def describe(self) -> str:
        return f"{self.size} of {self.vocab_size} tokens"


class DraftVocabMTP:
    """An MTP (native or a drafter's `ProposingMTP`) whose proposals come from the draft vocabulary: its rows,
    caches and hiddens unchanged, its logits over the V ids only."""

    def __init__(self, mtp, vocab: DraftVocab):
        self.inner = mtp
        self.vocab = vocab

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.inner.logits(g, vocab=self.vocab)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def restricted_mtp(mtp, vocab: DraftVocab | None):
    """`mtp` proposing from `vocab` (None: `mtp` itself)."""
    return mtp if vocab is None or mtp is None else DraftVocabMTP(mtp, vocab)


def draft_vocab_for(size: int | None, counts_from) -> DraftVocab | None:
    """The draft vocabulary of `size` tokens from the counts at `counts_from` (a drafter directory or a counts
    file); None when `size` is None."""
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"draft_vocab must be a positive number of tokens (or null: the whole vocabulary), "
                         f"got {size!r}")
    if counts_from is None:
        raise ValueError(f"draft_vocab={size} needs the drafter data's token counts: decode a drafter (its "
                         f"{COUNTS_NAME}) or name them with draft_vocab_from=<drafter dir or counts file>")
    return DraftVocab.most_frequent(load_token_counts(counts_from), size)


__all__ = ["COUNTS_NAME", "DraftVocab", "DraftVocabMTP", "draft_vocab_for", "load_token_counts", "restricted_mtp",
           "save_token_counts", "token_counts"]
