"""Decoding: target runtimes, proposers, the one speculative loop, CUDA graphs, verification, metrics.

The names below load on first use (PEP 562): the target families build their runners on
`dmtp.decode.runners`, and the loop picks a runner from the families' catalogue, so importing this package
must not import the loop before the families have loaded."""
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
