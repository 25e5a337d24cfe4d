"""`python -m dmtp.training.draft_vocab <drafter dir>`: write the draft-vocabulary token counts
(draft_vocab/token_counts.safetensors, dmtp.models.draft_vocab) of a drafter trained before training wrote them, from the
rows of the data its config.json's recorded training config names (the target's responses come from the
regeneration cache, as the run read them)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dmtp.models.draft_vocab import DraftVocab, save_token_counts, token_counts


def count_drafter_data(drafter_dir: str | Path) -> torch.Tensor:
    """The token counts of the rows the drafter at `drafter_dir` was trained on."""
    from omegaconf import OmegaConf

    from dmtp.configs import instantiate
    from dmtp.models.target import load_tokenizer
    from dmtp.tiny.targets import ensure_tiny_target

    config = json.loads((Path(drafter_dir) / "config.json").read_text())
    train_config = (config.get("dmtp") or {}).get("train_config")
    if not train_config:
        raise ValueError(f"{drafter_dir}/config.json records no training config: name a counts file instead")
    cfg = OmegaConf.create(train_config)
    node = cfg.target
    path = node.get("path") or str(ensure_tiny_target(node.get("preset") or "tiny"))
    target = instantiate(node, path=path, device="cpu")
    data = instantiate(cfg.data)(tokenizer=load_tokenizer(target.path), target=target)
    data.setup("fit")
    return token_counts(data.train_rows, target.config.vocab_size)


def coverage_line(counts: torch.Tensor) -> str:
    sizes = [v for v in (64, 128, 256, 512, 1024, 4096, 16384, 32768) if v < counts.numel()]
    return ", ".join(f"V={v}: {DraftVocab.most_frequent(counts, v).coverage(counts):.1%}" for v in sizes)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Write a drafter's draft-vocabulary token counts (token_counts."
                                             "safetensors) from the data its recorded training config names.")
    ap.add_argument("drafter", help="the drafter directory (config.json with its training config)")
    args = ap.parse_args(argv)
    counts = count_drafter_data(args.drafter)
    path = save_token_counts(args.drafter, counts, "python -m dmtp.training.draft_vocab (the recorded training data)")
    print(f"[dmtp] {int(counts.sum())} supervised tokens counted; coverage {coverage_line(counts)}")
    print(f"[dmtp] wrote {path}")


if __name__ == "__main__":
    main()
