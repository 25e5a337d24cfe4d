"""Decoding: target runtimes, proposers, the one speculative loop, CUDA graphs, verification, metrics."""
from dmtp.decode.loop import DecodeResult, SamplingConfig, SpecDecoder, build_proposer
from dmtp.decode.proposers import (ARProposer, DrafterProposer, MTPChainProposer, Proposer)
from dmtp.decode.runners import RecomputeTargetRunner, TargetRunner

__all__ = ["SpecDecoder", "SamplingConfig", "DecodeResult", "build_proposer", "Proposer", "ARProposer",
           "MTPChainProposer", "DrafterProposer", "RecomputeTargetRunner", "TargetRunner"]
