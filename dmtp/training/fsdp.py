"""The production multi-GPU trainer: FSDP2 (`torch.distributed.fsdp.fully_shard`) over the trainable drafter,
run by Lightning's own `ModelParallelStrategy` (conf/trainer/fsdp.yaml; multi-node through `num_nodes`).

What is sharded, and why (README "Training at scale" has the memory arithmetic for 27B and 35B-A3B targets):
- The trainable parts (the drafter, and the MTP when `model.train_mtp`) form ONE FSDP unit rooted at the
  LightningModule: their fp32 weights, gradients and AdamW state are split over the data-parallel ranks
  (ZeRO-3 for the part that carries optimizer state). The unit is gathered once per step, on the module's
  `forward` (`DMTPModule.forward` is the whole training loss), because the drafter's weights are used by
  several of its methods (context K/V, the injection's slots, the loss), not by one `forward`; a 1-2B
  drafter gathered whole costs ~2-4 GB for the step, small beside the frozen target.
- The frozen target and MTP are not in that unit (`ignored_params`): no gradient, no optimizer state, bf16.
  By default they are replicated on every rank, so the target forward costs no communication.
  `shard_target=true` gives each target decoder layer its own FSDP unit instead (all-gathered layer by layer
  in the forward, freed after it): the memory a 35B-A3B target needs on 80 GB cards. Its embedding and LM
  head stay replicated, since the drafter reads them outside the target's forward.
- Gradient clipping by norm is torch's `clip_grad_norm_` on the sharded (DTensor) gradients: the norm is
  reduced over the ranks, so it is the norm of the full gradient.
- Checkpoints hold the full trainable state (weights and optimizer, gathered, written by rank 0 through the
  run's CheckpointIO): one file per checkpoint that resumes at any world size (`resume=`, `ckpt_path=`), the
  same file a single-device run writes. The frozen target is never gathered or written.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.tensor import DTensor

def is_sharded(module: nn.Module) -> bool:
    """Whether `module` holds FSDP-sharded parameters."""
    return any(isinstance(p, DTensor) for p in module.parameters())


def shard_trainable(module: nn.Module, frozen: list[nn.Module], mesh, shard_frozen_layers: list[nn.Module] = ()) -> None:
    """FSDP2 over `module`'s trainable parameters (one unit rooted at `module`), the `frozen` modules' own
    parameters left out (replicated) except those of `shard_frozen_layers`, each its own unit."""
    from torch.distributed.fsdp import fully_shard

    for layer in shard_frozen_layers:
        fully_shard(layer, mesh=mesh)
    sharded = {p for layer in shard_frozen_layers for p in layer.parameters()}
    ignored = {p for m in frozen for p in m.parameters() if not p.requires_grad and p not in sharded}
    fully_shard(module, mesh=mesh, ignored_params=ignored)


@contextmanager
def gathered(module: nn.Module):
    """`module`'s sharded weights gathered for use outside its forward (the validation walk), then freed.

    A collective: every rank enters it. No-op when nothing is sharded."""
    if not is_sharded(module):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


def full_state(module: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """`module.state_dict()` on the host with every sharded tensor gathered whole (a collective: every rank
    calls it, each gets the full tensors), keys starting with `skip` left out (never gathered)."""
    out = {}
    for key, value in module.state_dict().items():
        if key.startswith(skip):
            continue
        if isinstance(value, DTensor):
            value = value.full_tensor()
        out[key] = value.detach().cpu()
    return out


class DrafterFSDPStrategy(ModelParallelStrategy):
    """Lightning's FSDP2 strategy, data-parallel only (every rank one shard of the data-parallel mesh), with
    checkpoints of the trainable state only. `shard_target`: see the module docstring.

    The sharding itself is the LightningModule's `configure_model` (Lightning's contract), which reads
    `shard_target` here."""

    def __init__(self, shard_target: bool = False, **kwargs) -> None:
        if not isinstance(shard_target, bool):
            raise ValueError(f"trainer.strategy.shard_target must be true or false, got {shard_target!r}")
        kwargs.setdefault("save_distributed_checkpoint", False)
        super().__init__(**kwargs)
        self.shard_target = shard_target

    def setup_environment(self) -> None:
        # Pure data parallelism: one mesh dimension over every rank of every node (the parent's "auto"
        # would make each node a tensor-parallel group).
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()

    def teardown(self) -> None:
        super().teardown()
        # ModelParallelStrategy's teardown skips the CheckpointIO's: a checkpoint still being written in the
        # background (dmtp.runs.checkpoint_io) is waited for, and its failure raised, here.
        self.checkpoint_io.teardown()

    @property
    def data_parallel_mesh(self):
        return self.device_mesh["data_parallel"]

    def lightning_module_state_dict(self) -> dict:
        """The trainable tensors, gathered whole (every rank takes part; rank 0 writes them).

        The frozen target and MTP are skipped before anything is gathered or copied."""
        module = self.lightning_module
        return full_state(module, skip=tuple(module.checkpoint_excludes))

    def optimizer_state(self, optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        if hasattr(optimizer, "_optimizer"):   # LightningOptimizer
            optimizer = optimizer._optimizer
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        # Keyed by parameter name: any world size loads it.
        return get_optimizer_state_dict(self.model, optimizer, options=options)

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        """A full checkpoint (ours, from any world size, or a single-device run's): every rank reads it and
        keeps its own shard of the weights and of the optimizer state."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        from dmtp.runs.resume import current_key

        path = self.broadcast(checkpoint_path)
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=weights_only)
        module = self.lightning_module
        state = {current_key(k): v for k, v in checkpoint["state_dict"].items()}
        load_full_state(module, state)
        options = StateDictOptions(full_state_dict=True)
        for optimizer, saved in zip(self.optimizers, checkpoint.get("optimizer_states", [])):
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=saved, options=options)
        checkpoint["state_dict"] = {}   # loaded here: Lightning's own load of it is skipped (below)
        return checkpoint

    def load_model_state_dict(self, checkpoint, strict: bool = True) -> None:
        pass   # done in load_checkpoint, shard by shard

    def load_optimizer_state_dict(self, checkpoint) -> None:
        pass   # done in load_checkpoint


def load_full_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy full tensors (every rank holds them) into `module`, each rank keeping its own shard; the tensors
    a checkpoint leaves out (the frozen target) are left as they are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    unknown = sorted(set(state) - set(module.state_dict()))
    if unknown:
        raise ValueError(f"checkpoint tensor {unknown[0]} is not in this run's module")
    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=False))
