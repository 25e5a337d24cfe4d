"""Speed where users serve: stage-cost profiles per (shape, device, dtype, batch), the round each method runs, and
the projected speed-up over AR beside every tau (issue 64).

* `dmtp.speed.recipe`: what one round of a method runs (`round_recipe`: from the method's own config).
* `dmtp.speed.profile`: a profile's file (`load_profile`; shipped ones in dmtp/speed/profiles/).
* `dmtp.speed.projection`: `projected_speedup(method, tau, profile, batch)` = tau x AR step / round.
* `python -m dmtp.bench.speed_profile`: measures a profile at a shape, on the CPU or a GPU.
* `python -m dmtp.speed.reference`: writes the shipped 8B/H200 profile from reference/real-scale.md's figures.
"""
from dmtp.speed.profile import DEFAULT_PROFILE, SpeedProfile, StageCost, load_profile, shipped_profiles
from dmtp.speed.projection import PROJECTED_BATCHES, Projection, project, projected_speedup, projections
from dmtp.speed.recipe import BlockForward, RoundRecipe, round_recipe

__all__ = ["BlockForward", "DEFAULT_PROFILE", "PROJECTED_BATCHES", "Projection", "RoundRecipe", "SpeedProfile",
           "StageCost", "load_profile", "project", "projected_speedup", "projections", "round_recipe",
           "shipped_profiles"]
