"""A target decoded by the one loop: its runner chosen from the families' catalogue (`spec_decoder`), and a
decoding method as a loop decoder (`build_decoder`: ar | mtp415 | mtp | mtp:<k> | drafter).

The loop itself (dmtp.decode.loop.SpecDecoder) takes a runner and knows no family; this is where the two meet,
above both, for every caller that builds a decoder (dmtp.inference.setup, the engines, regeneration, tests).
"""
from __future__ import annotations

from dmtp.decode.loop import SpecDecoder, build_proposer
from dmtp.families.catalogue import make_target_runner


def spec_decoder(target, proposer, eos_token_id=None, *, runner: str = "auto", attention: str = "auto",
                 **loop_options) -> SpecDecoder:
    """The loop on `target` with `proposer`: `runner` auto (a family's static-cache runner when one drives the
    target, else the exact recompute oracle, with one line saying why) | fast | recompute; `attention`: the
    runner's; `loop_options`: SpecDecoder's (cuda_graphs, compile, time_stages, ...)."""
    made = make_target_runner(target, proposer.layer_ids, kind=runner, attention=attention)
    return SpecDecoder(target, proposer, eos_token_id, runner=made, **loop_options)


def build_decoder(target, method: str, eos_token_id, *, mtp=None, drafter=None, mtp_steps: int = 4,
                  name: str | None = None, draft_vocab=None, **engine) -> SpecDecoder:
    """`method` of the one loop on `target` (a TargetModel): ar | mtp415 | mtp | mtp:<k> | drafter (a
    BlockDrafter). `draft_vocab`: the drafting heads' reduced vocabulary (dmtp.models.draft_vocab; None: the
    whole head). `engine`: the loop's options (runner, attention, cuda_graphs, compile, warmup_rounds)."""
    proposer = build_proposer(method, target, mtp=mtp, drafter=drafter, mtp_steps=mtp_steps, name=name,
                              draft_vocab=draft_vocab)
    return spec_decoder(target, proposer, eos_token_id=eos_token_id, **engine)


__all__ = ["build_decoder", "spec_decoder"]
