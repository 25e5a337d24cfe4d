"""A training run's lifecycle, apart from what it trains: where it lives and how it continues.

dirs.py              path rules (no torch): `<run>/checkpoints/*.ckpt`, which directory a resume continues in
records.py           Hydra's record of the command, and which run directories this command made
plan.py              the run's plan, made once before anything is built (`RunPlan`: checkpoint, directory, config)
resume.py            the newest checkpoint that loads, the directory claimed by one run, checkpoint shapes checked
lock.py              one writer per run directory: held until the run ends, refused to a second one in one line
recorded_config.py   the config a run records in its checkpoints, and what a resume may change
first_step.py        a run that stops before its first step leaves its directory as it found it
checkpoint_io.py     checkpoints written atomically (inline or in the background)
rng_state.py         every RNG stream saved and restored with the checkpoint (a resume continues bit for bit)
guards.py            a non-finite loss stops the run in one line instead of training on NaN
progress.py          progress lines and the step bar
"""
