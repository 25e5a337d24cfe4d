"""README.md beside an exported drafter: what it is, what it was trained for and how, and how well it does.

Written by `BlockDrafter.save` (the header: target and its hashes, variant, options, block size, and the
training recipe when the run's composed config is given); the training job adds the final validation walk's
table and `dmtp.infer` each table it prints for this drafter (`set_card_section`). Sections sit between
`<!-- dmtp:<key> -->` markers, so writing one again replaces it rather than stacking copies.
"""
from __future__ import annotations

import json
from pathlib import Path

from dmtp.atomic_io import write_text

CARD_NAME = "README.md"
MARK = "<!-- dmtp:{} -->"
END = "<!-- /dmtp:{} -->"


def _section(key: str, title: str, body: str) -> str:
    return f"{MARK.format(key)}\n## {title}\n\n{body.rstrip()}\n{END.format(key)}\n"


def _fenced(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text.rstrip()}\n```"


def card_header(meta: dict, config: dict) -> str:
    """The card's first part from the drafter's config.json (`config`) and its "dmtp" section (`meta`)."""
    target = meta.get("target")
    front = ["---", "library_name: dmtp", "tags: [speculative-decoding, dflash, mtp]"]
    if target and not Path(str(target)).expanduser().exists():   # a hub id: the Hub links the model card to it
        front.append(f"base_model: {target}")
    front.append("---")
    mtp = meta.get("target_mtp_sha256") or {}
    rows = [("target", target or "not recorded"),
            ("target config.json sha256", meta.get("target_config_sha256") or "not recorded (not a local checkpoint)"),
            *((f"target MTP file `{name}` sha256", sha) for name, sha in sorted(mtp.items())),
            ("variant (injection)", meta.get("injection")),
            ("variant options", json.dumps(meta.get("injection_kwargs") or {}, sort_keys=True)),
            ("drafter architecture", ", ".join(config.get("architectures") or [])),
            ("block size", config.get("block_size")),
            ("drafter layers", config.get("num_hidden_layers")),
            ("tapped target layers", (config.get("dflash_config") or {}).get("target_layer_ids")),
            ("weights dtype", config.get("torch_dtype"))]
    table = "| | |\n|---|---|\n" + "".join(f"| {k} | `{v}` |\n" for k, v in rows)
    intro = (f"# dmtp drafter: {meta.get('injection')}\n\nA block drafter trained with dmtp for the target below. "
             "Decode it with `python -m dmtp.infer drafter=<this directory>`; a raw-DFlash export is also served "
             "unchanged by vLLM (`method: dflash`), a DMTP one through dmtp's vLLM plug-in.\n")
    return "\n".join(front) + "\n\n" + intro + "\n" + table


def write_card(drafter_dir: str | Path, meta: dict, config: dict, train_config: dict | None = None) -> Path:
    """(Re)write the card from the export.

    A new export starts a new card: the sections added to an earlier one (walk, dmtp.infer tables) measured other
    weights."""
    import yaml

    parts = [card_header(meta, config)]
    if train_config is not None:
        recipe = yaml.safe_dump(train_config, sort_keys=False, default_flow_style=False)
        parts.append(_section("recipe", "Training recipe (the run's composed config)", _fenced(recipe, "yaml")))
    path = Path(drafter_dir) / CARD_NAME
    write_text(path, "\n".join(parts))
    return path


def set_card_section(drafter_dir: str | Path, key: str, title: str, body: str, fenced: bool = True) -> bool:
    """Put section `key` in the card (replacing its earlier text, else appended).

    False, and nothing written, when the directory has no dmtp card (a drafter exported elsewhere: its README is not
    ours to edit)."""
    path = Path(drafter_dir) / CARD_NAME
    if not path.is_file():
        return False
    text = path.read_text()
    if MARK.format("recipe") not in text and "library_name: dmtp" not in text:
        return False
    new = _section(key, title, _fenced(body) if fenced else body)
    start, end = text.find(MARK.format(key)), text.find(END.format(key))
    if start >= 0 and end > start:
        text = text[:start] + new + text[end + len(END.format(key)) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + new
    write_text(path, text)
    return True


__all__ = ["CARD_NAME", "card_header", "set_card_section", "write_card"]
