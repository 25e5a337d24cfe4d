"""Decoding: target runtimes, proposers, the one speculative loop, CUDA graphs, verification, metrics."""
from dmtp.decode.loop import DecodeResult, SamplingConfig, SpecDecoder, build_proposer
from dmtp.decode.proposers import (ARProposer, DrafterProposer, MTPChainProposer, Proposer)
from dmtp.decode.runners import FastTargetRunner, RecomputeTargetRunner, make_target_runner

__all__ = ["SpecDecoder", "SamplingConfig", "DecodeResult", "build_proposer", "Proposer", "ARProposer",
           "MTPChainProposer", "DrafterProposer", "FastTargetRunner", "RecomputeTargetRunner",
           "make_target_runner"]
