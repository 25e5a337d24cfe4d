"""`python -m dmtp.regime`'s run: load the target and its MTP, measure every workload, print and record it."""
from __future__ import annotations

from pathlib import Path

from dmtp.atomic_io import write_json
from dmtp.data.corpora import corpus_of_target
from dmtp.decode.loop import parse_mtp_steps
from dmtp.inference.options import require_counts, require_workloads
from dmtp.inference.prompt_choice import embedded_prompts, fit_prompts, prompt_limit
from dmtp.inference.regime import BAND, regime_of, regime_table
from dmtp.inference.setup import load_mtp, load_target, placement
from dmtp.models.mtp_errors import MTPLoadError


def report_regime(cfg) -> dict:
    require_counts(cfg, ("num_prompts", "max_new_tokens", "batch_size", "eval.prompt_tokens"))   # before anything loads
    require_workloads(cfg.eval.domains)
    device, dtype = placement(cfg.device, cfg.dtype)
    target = load_target(cfg.target, device, dtype)
    try:
        mtp = load_mtp(target).to(device=device, dtype=dtype).eval()
    except (MTPLoadError, FileNotFoundError) as e:   # its figures are the MTP's: nothing to measure without it
        raise MTPLoadError(f"dmtp.regime measures the target's MTP (its agreement and MTP415's acceptance), which "
                           f"did not load: {e}; place a target that has one (target=<preset> or target.path=<dir>)") \
            from None
    corpus = corpus_of_target(target.path)
    workloads = embedded_prompts(target.tokenizer, list(cfg.eval.domains), cfg.num_prompts, cfg.eval.prompt_tokens,
                                 corpus)
    # MTP415 decodes every workload: its block (1 + its 4 steps) past the budget must fit the target's positions
    limit, why = prompt_limit(target.model, cfg.max_new_tokens, 1 + parse_mtp_steps("mtp415"))
    workloads = fit_prompts(workloads, limit, why, truncate=None)
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
