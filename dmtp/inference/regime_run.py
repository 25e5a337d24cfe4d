"""`python -m dmtp.regime`'s run: load the target and its MTP, measure every workload, print and record it."""
from __future__ import annotations

from pathlib import Path

from dmtp.atomic_io import write_json
from dmtp.data.corpora import corpus_of_target
from dmtp.inference.prompt_choice import embedded_prompts
from dmtp.inference.regime import BAND, regime_of, regime_table
from dmtp.inference.setup import load_mtp, load_target, placement


def report_regime(cfg) -> dict:
    device, dtype = placement(cfg.device, cfg.dtype)
    target = load_target(cfg.target, device, dtype)
    mtp = load_mtp(target).to(device=device, dtype=dtype).eval()
    corpus = corpus_of_target(target.path)
    workloads = embedded_prompts(target.tokenizer, list(cfg.eval.domains), cfg.num_prompts, cfg.eval.prompt_tokens,
                                 corpus)
    rows = regime_of(target.model, mtp, workloads, target.eos_token_id, cfg.max_new_tokens, cfg.batch_size,
                     cfg.seed)
    print(f"[dmtp] regime of {target.path} (corpus {corpus}; {cfg.num_prompts} prompts per workload, "
          f"{cfg.max_new_tokens} new tokens; < / > marks a figure under / over the published band)")
    print(regime_table(rows))
    record = {"target": target.path, "corpus": corpus, "num_prompts": cfg.num_prompts,
              "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "band": BAND, "workloads": rows}
    write_json(Path(cfg.output_dir) / "regime.json", record)
    print(f"[dmtp] written to {Path(cfg.output_dir) / 'regime.json'}")
    return record
