"""Decoding: target runtimes, proposers, the one speculative loop, CUDA graphs, verification, metrics.

The names below load on first use (PEP 562), so that a module needing one piece (the target families
import only `dmtp.decode.runners`, the serving adapters only `sampling`) does not load the whole loop."""
from importlib import import_module

_EXPORTS = {"SpecDecoder": "loop", "SamplingConfig": "sampling", "DecodeResult": "loop", "build_proposer": "loop",
            "DecodeState": "state",
            "Proposer": "proposers", "ARProposer": "proposers", "MTPChainProposer": "proposers",
            "DrafterProposer": "proposers", "RecomputeTargetRunner": "runners", "TargetRunner": "runners"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dmtp.decode' has no attribute {name!r}")
    return getattr(import_module(f"dmtp.decode.{_EXPORTS[name]}"), name)
