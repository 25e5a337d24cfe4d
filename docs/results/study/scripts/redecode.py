"""Re-decode the sampled modes of the study's greedy production row with the shipped code (the greedy-only MTP
correction rule), replacing those modes in each job's metrics.json "eval" record."""
import json, subprocess, sys, glob
import torch
from dmtp.drafters.block_drafter import load_block_drafter
from dmtp.models.target import TargetModel, load_tokenizer
from dmtp.families.mtp_loading import load_native_mtp
from dmtp.training.evaluate import decode_after_training
torch.set_num_threads(1)
commit = subprocess.run(["git", "-C", "/work/main", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
tdir = '/root/.cache/dmtp/targets/tiny-0d0bd710'
target = TargetModel.from_pretrained(tdir).eval()
tok = load_tokenizer(tdir)
mtp = load_native_mtp(tdir, target.embed_tokens, target.lm_head)
modes = [{"temperature": 1.0, "verification": "rejection"}, {"temperature": 1.0, "verification": "block"},
         {"temperature": 0.6, "verification": "rejection"}, {"temperature": 0.6, "verification": "block"}]
for job in sorted(glob.glob('/work/exp/study/seed*/*study_production,*')):
    drafter, _ = load_block_drafter(job + '/drafter')
    drafter.mtp_correction.greedy_only = True   # trained with label_source=target, loss=ce: what the rule marks (its export predates the flag)
    seed = int(job.split('seed=')[1])
    out = decode_after_training(target, mtp, drafter, tok, methods=["drafter"], modes=modes, seed=seed)
    m = json.load(open(job + '/metrics.json'))
    for name, per in out["eval"]["modes"].items():
        m["eval"]["modes"][name] = per
    m["eval"]["protocol"]["redecoded_sampled_modes_at"] = commit
    json.dump(m, open(job + '/metrics.json', 'w'))
    print(job, {k: round(v["all"]["drafter"]["tau"], 3) for k, v in out["eval"]["modes"].items()}, flush=True)
