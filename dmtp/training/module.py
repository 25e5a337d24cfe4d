"""The one LightningModule behind every variant: frozen target + MTP, trained block drafter (a DFlash or
DFlash2 backbone and its injection, `dmtp.drafters.block_drafter.BlockDrafter`, trained as one module).

It knows the injection interface, never a variant's name. Per batch: teacher-forced target and MTP
features, random anchors, every block's MTP tokens (m of them, `sample_num_mtp`; T1..Tm are inputs,
not labels) and slots from the injection module, one drafter forward, position-decayed cross-entropy
over the positions the drafter predicts (`loss`: ce, tv or DSpark's mix, dmtp/training/losses.py).

`train_mtp=True` (joint training): the MTP's own layers (not the shared embedding / LM head) join the
optimizer, the block loss reaches them through the MTP hiddens (no stop-gradient then), and the
MTP's own next-token loss on the same labels (`label_source`), weighted by `mtp_loss_weight`, keeps
its first-token skill. The default (False) is the frozen MTP, unchanged.
"""
from __future__ import annotations

import math

import lightning as L
import torch

from dmtp.drafters.block_drafter import BlockDrafter, MTPBlockInputs
from dmtp.drafters.fit import require_target_fit
from dmtp.training.cached_features import cached_teacher_features, rows_of
from dmtp.training.losses import token_loss
from dmtp.training.blocks import (draft_blocks, mtp_block_inputs, predicted_positions, sample_anchors, teacher_features,
                                  valid_anchors)
from dmtp.training.draws import BatchDraws, RowDraws
from dmtp.training.fsdp import gathered, is_sharded, shard_trainable
from dmtp.training.module_options import JointMTP, Objective, WalkOptions, grouped
from dmtp.runs.resume import current_key
from dmtp.training.validation import empty_walk, exact_acceptance, merged_walk, summed_over_ranks, walk_share

FROZEN_PREFIXES = ("target.", "mtp.")   # what checkpoints leave out (the MTP is kept when it trains)


def decay_weights(n: int, gamma: float, device=None) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma), k = 1..n (gamma <= 0: no decay)."""
    k = torch.arange(n, dtype=torch.float32, device=device)
    return torch.exp(-k / gamma) if gamma and gamma > 0 else torch.ones(n, device=device)


def dmtp_module(target, mtp, drafter: BlockDrafter, optimizer, scheduler=None, **options) -> "DMTPModule":
    """Hydra's entry point (conf/train.yaml `model:`): the flat options grouped into their records
    (dmtp.training.module_options)."""
    return DMTPModule(target, mtp, drafter, optimizer, scheduler, **grouped(options))


class DMTPModule(L.LightningModule):
    def __init__(self, target, mtp, drafter: BlockDrafter, optimizer, scheduler=None,
                 objective: Objective = Objective(), walk: WalkOptions = WalkOptions(), joint: JointMTP = JointMTP()):
        super().__init__()
        self.loss_mix = objective.loss_mix   # (CE weight, TV weight): dmtp/training/losses.py
        self.loss_name = objective.loss
        if drafter.needs_mtp and mtp is None:
            raise ValueError("this injection variant needs the target's MTP layer, but none was loaded")
        if joint.train and mtp is None:
            raise ValueError("model.train_mtp=true trains the target's MTP with the drafter, but this injection "
                             "variant does not use the MTP")
        require_target_fit(drafter.config, target)
        self.target, self.mtp = target, mtp
        self.drafter = drafter
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.num_anchors, self.loss_gamma = objective.num_anchors, objective.loss_gamma
        self.label_source, self.t1_source = objective.label_source, objective.t1_source
        self.label_temperature = objective.label_temperature
        if drafter.mtp_correction_rank:   # hard labels and CE alone: the correction serves greedy decoding only
            drafter.mtp_correction.greedy_only = objective.label_source != "target_kl" and self.loss_mix == (1.0, 0.0)
        self.val_walk = walk.enabled
        k = drafter.num_candidates   # the chain is compared within the drafter's block
        steps = walk.mtp_chain_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= k:
            raise ValueError(f"val_mtp_chain_steps must be an integer in 0..{k}, got {steps!r} "
                             f"(the chain is walked within the drafter's block of {k + 1})")
        self.val_mtp_chain_steps = steps
        self.train_mtp, self.mtp_loss_weight = joint.train, joint.loss_weight
        if joint.train:   # its own layers only: the embedding and LM head are the target's, never trained
            mtp.requires_grad_(True)
        self.strict_loading = False  # checkpoints omit the frozen target and MTP
        self._val_results: dict[str, list[dict]] = {}
        # Training's anchors are drawn per row from (this seed, step, row index): dmtp.training.draws.
        # seed_everything(cfg.seed) ran before the module was built, so this is the run's seed.
        self.draw_seed = torch.initial_seed()

    # -- frozen parts stay frozen ---------------------------------------------------------------
    @property
    def checkpoint_excludes(self) -> tuple[str, ...]:
        """State-dict prefixes a checkpoint leaves out: the frozen parts (a trained MTP is kept)."""
        return ("target.",) if self.train_mtp else FROZEN_PREFIXES

    def on_fit_start(self) -> None:
        for frozen in (self.target, self.mtp):
            if frozen is not None:
                frozen.eval().requires_grad_(frozen is self.mtp and self.train_mtp)

    def train(self, mode: bool = True):
        super().train(mode)
        for frozen in (self.target, self.mtp):
            if frozen is not None:
                frozen.eval()
        return self

    def configure_model(self) -> None:
        """Under the FSDP strategy (dmtp.training.fsdp; Lightning calls this with its device mesh set), shard
        the trainable parts as one unit, the frozen target and MTP left out (or the target's decoder layers
        sharded layer by layer with `shard_target`).

        Other strategies have no mesh: nothing to do."""
        if self.device_mesh is None or is_sharded(self.drafter):
            return
        strategy = self.trainer.strategy
        mesh = strategy.device_mesh["data_parallel"]
        frozen = [m for m in (self.target, self.mtp) if m is not None]
        layers = list(self.target.decoder_layers()) if getattr(strategy, "shard_target", False) else []
        shard_trainable(self, frozen, mesh, layers)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items()
                                    if not k.startswith(self.checkpoint_excludes)}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["state_dict"] = {current_key(k): v for k, v in checkpoint["state_dict"].items()}

    # -- the loss ---------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, draws=None, step: int | None = None,
                cached: dict | None = None):
        """The whole training loss of a batch (`block_loss`): under FSDP the trainable unit is gathered for
        it, and its gradients reduced after its backward, through this call (dmtp.training.fsdp)."""
        return self.block_loss(input_ids, loss_mask, step=step, draws=draws, cached=cached)

    def teacher(self, input_ids: torch.Tensor, cached: dict | None = None):
        """The batch's teacher features: the target's forward, or the feature cache's (`cached`, data.features)."""
        if cached is not None:
            return cached_teacher_features(self.drafter, self.mtp, input_ids, cached, self.drafter.config.vocab_size,
                                           mtp_grad=self.train_mtp, logits=self.needs_target_logits)
        return teacher_features(self.target, self.mtp, self.drafter, input_ids, mtp_grad=self.train_mtp,
                                logits=self.needs_target_logits)

    def block_loss(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, generator=None, step: int | None = None,
                   draws=None, cached: dict | None = None):
        """(loss, per-position accuracy, number of supervised slots).

        The loss is the position-decayed CE plus the drafter's own `auxiliary_loss` (0 for DFlash v1; DFlash2's
        selector term, scheduled by `step`), which is also kept in `self.last_auxiliary_loss`. Random draws
        (anchors, m) come from `draws` (dmtp.training.draws), else from `generator`."""
        inj = self.drafter.injection
        draws = draws or BatchDraws(generator)
        # The draws first: they read the anchors' count on the host, which waits only for this batch's copy
        # here, not for the target's forward (the whole step is then queued on the device without a wait).
        anchors, keep = sample_anchors(valid_anchors(inj, loss_mask), self.num_anchors, draws=draws)
        num = inj.sample_num_mtp(anchors.shape, draws, input_ids.device) if inj.uses_mtp else None
        feats = self.teacher(input_ids, cached)
        mtp_inputs = None
        if inj.uses_mtp:
            mtp_inputs, keep = self._mtp_inputs(input_ids, feats, anchors, keep, num)
        block = draft_blocks(self.drafter, self.target.embed_tokens.weight, feats, anchors, keep, mtp_inputs,
                             mtp_grad=self.train_mtp)
        labels, teacher, mask = self._block_targets(input_ids, loss_mask, feats, anchors, keep, num)
        weights = decay_weights(labels.shape[-1], self.loss_gamma, labels.device) * mask
        # Each predicted slot's predecessor is the token one position earlier on the gold path: the slot
        # before the first prediction holds A (raw_dflash) or T1 (= the data token x_{a+1} in training).
        prev = torch.cat([block.previous[..., None], labels[..., :-1]], dim=-1)
        # The drafter's logits given those predecessors (DSpark's Markov head reads them, teacher-forced;
        # the other drafters' logits do not depend on them).
        logits = self.drafter.block_logits(block.hidden, self.target.lm_head.weight, prev).float()  # [B, N, n_pred, V]
        per_slot = token_loss(logits, self.loss_mix, self.label_source == "target_kl", labels, teacher,
                              self.label_temperature)
        loss = (per_slot * weights).sum() / self._mean_over_ranks(weights.sum()).clamp(min=1e-6)
        aux = self.drafter.auxiliary_loss(block.hidden, self.target.lm_head.weight, labels, prev, weights,
                                          step=step, logits=logits)
        self.last_auxiliary_loss = aux.detach()
        loss = self._add_mtp_losses(loss + aux, feats, loss_mask, mtp_inputs, anchors, keep)
        correct = (logits.argmax(-1) == labels) & mask
        acc = correct.flatten(0, 1).sum(0) / mask.flatten(0, 1).sum(0).clamp(min=1)
        return loss, acc, mask.sum()

    def _mtp_inputs(self, input_ids: torch.Tensor, feats, anchors: torch.Tensor, keep: torch.Tensor,
                    num: torch.Tensor) -> tuple[MTPBlockInputs, torch.Tensor]:
        """T1..TM: the data tokens after each anchor (teacher forcing), m of them per block, through the MTP
        chain; with `t1_source=mtp` a block is kept only if the MTP itself proposes its m tokens."""
        steps = self.drafter.injection.max_mtp_tokens
        offsets = torch.arange(1, steps + 1, device=input_ids.device)
        data = _tokens_at(input_ids, (anchors[..., None] + offsets).clamp(max=input_ids.shape[1] - 1))
        chain = mtp_block_inputs(self.mtp, feats, anchors, steps, tokens=data, mtp_grad=self.train_mtp)
        if self.t1_source == "mtp":
            own = self.drafter.proposing_mtp(self.mtp).logits(chain.hidden).argmax(-1)
            keep = keep & ((own == data) | (offsets > num[..., None])).all(-1)
        return MTPBlockInputs(chain.tokens, chain.hidden, num), keep

    def _block_targets(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, feats, anchors: torch.Tensor,
                       keep: torch.Tensor, num: torch.Tensor | None):
        """(labels, the teacher's logits or None, the supervised mask) of every predicted slot [B, N, n_pred]."""
        inj = self.drafter.injection
        t = input_ids.shape[1]
        pos = predicted_positions(inj, anchors)
        pos_c = pos.clamp(max=t - 1)
        # The target's distribution over the token at p is its output at p - 1.
        target_rows = (pos_c - 1).clamp(min=0)
        if self.label_source == "data":
            labels = _tokens_at(input_ids, pos_c)
        else:  # the target's own greedy prediction of each position (distillation labels)
            labels = _tokens_at(feats.target_logits.argmax(-1), target_rows)
        mask = keep[..., None] & (pos < t) & _tokens_at(loss_mask, pos_c).bool()
        if num is not None:   # slots of candidates 1..m hold MTP tokens (inputs): no prediction there
            mask = mask & inj.drafter_slot_mask(num)
        teacher = None
        if self.label_source == "target_kl" or self.loss_mix[1]:
            v = feats.target_logits.shape[-1]
            rows = target_rows.flatten(1)[..., None].expand(-1, -1, v)
            teacher = feats.target_logits.gather(1, rows).view(*pos.shape, v)
        return labels, teacher, mask

    def _add_mtp_losses(self, loss: torch.Tensor, feats, loss_mask: torch.Tensor, mtp_inputs: MTPBlockInputs | None,
                        anchors: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """`loss` plus the MTP's own next-token loss when it trains, and its proposals' loss through the
        drafter's correction (added in that order)."""
        if self.train_mtp:
            mtp_loss = self.mtp_next_token_loss(feats, loss_mask, self.mtp, (1.0, 0.0))
            self.last_mtp_loss = mtp_loss.detach()
            loss = loss + self.mtp_loss_weight * mtp_loss
        if self.drafter.mtp_correction_rank:
            proposing = self.drafter.proposing_mtp(self.mtp)
            correction_loss = self.mtp_next_token_loss(feats, loss_mask, proposing, self.loss_mix)
            if mtp_inputs is not None and mtp_inputs.hidden.shape[-2] > 1:   # the chain's later steps, as decoded
                correction_loss = 0.5 * (correction_loss + self.chain_correction_loss(
                    feats, loss_mask, proposing, mtp_inputs.hidden, anchors, keep))
            self.last_correction_loss = correction_loss.detach()
            loss = loss + correction_loss
        return loss

    @property
    def needs_target_logits(self) -> bool:
        """Whether the loss reads the target's distribution (distillation labels, the TV term); a loss on the
        data tokens alone skips the target's LM head."""
        return self.label_source != "data" or bool(self.loss_mix[1])

    def _mean_over_ranks(self, total: torch.Tensor) -> torch.Tensor:
        """In training across data-parallel ranks: the mean of `total` (the loss weights' sum) over the ranks,
        so that the ranks' averaged gradients are those of ONE weighted mean over the global batch, the same
        at any world size.

        Elsewhere `total` itself."""
        trainer = self._trainer
        if not (torch.is_grad_enabled() and self.training and trainer is not None and trainer.world_size > 1):
            return total
        total = total.detach().clone()
        torch.distributed.all_reduce(total)
        return total / trainer.world_size

    def mtp_next_token_loss(self, feats, loss_mask: torch.Tensor, mtp, mix: tuple[float, float]) -> torch.Tensor:
        """The loss of `mtp`'s own proposals (a jointly trained MTP: mix (1, 0); the drafter's MTP correction: the
        drafter's loss mix): g_t (row t, t = 1..T-2) predicts x_{t+1}, against the same labels as the drafter
        (`label_source`: the data token, the target's greedy token, or its distribution), at the label temperature."""
        logits = mtp.logits(feats.mtp_hidden[:, 1:-1]).float()             # [B, T-2, V]
        mask = loss_mask[:, 2:].float()
        teacher = feats.target_logits[:, 1:-1] if feats.target_logits is not None else None   # the target's x_{t+1}
        labels = feats.input_ids[:, 2:] if self.label_source == "data" else teacher.argmax(-1)
        per_token = token_loss(logits, mix, self.label_source == "target_kl", labels, teacher, self.label_temperature)
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)

    def chain_correction_loss(self, feats, loss_mask: torch.Tensor, proposing, chain_hidden: torch.Tensor,
                              anchors: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The corrected MTP's proposals at its chain's steps j = 2..M from every anchor (chain_hidden [B, N, M, H]:
        h_j, fed the data tokens T_1..T_{j-1} as training's chain is), the hiddens a multi-step block decodes
        with, which the teacher-forced rows of `mtp_next_token_loss` never show it: h_j predicts the token at
        anchor + j, against the target's labels there."""
        t = feats.input_ids.shape[1]
        steps = chain_hidden.shape[-2]
        pos = anchors[..., None] + torch.arange(2, steps + 1, device=anchors.device)          # [B, N, M-1]
        pos_c = pos.clamp(max=t - 1)
        valid = keep[..., None] & (pos < t) & loss_mask.gather(1, pos_c.flatten(1)).view_as(pos).bool()
        logits = proposing.logits(chain_hidden[..., 1:, :]).float()
        teacher = None
        if feats.target_logits is not None:   # the target's distribution of the token at p: its output at p - 1
            v = feats.target_logits.shape[-1]
            teacher = feats.target_logits.gather(1, (pos_c - 1).flatten(1)[..., None].expand(-1, -1, v)).view(
                *pos.shape, v)
        labels = feats.input_ids.gather(1, pos_c.flatten(1)).view_as(pos) if self.label_source == "data" \
            else teacher.argmax(-1)
        per_token = token_loss(logits, self.loss_mix, self.label_source == "target_kl", labels, teacher,
                               self.label_temperature)
        w = valid.float()
        return (per_token * w).sum() / w.sum().clamp(min=1.0)

    def training_step(self, batch, batch_idx):
        # Anchors per row from (seed, step, row index): the same draws at any world size (dmtp.training.draws).
        draws = RowDraws(self.draw_seed, self.global_step, batch["index"])
        loss, acc, n = self(batch["input_ids"], batch["loss_mask"], draws, self.global_step, batch.get("features"))
        bs = batch["input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        if self.drafter.auxiliary_loss_name:
            self.log(f"train/{self.drafter.auxiliary_loss_name}", self.last_auxiliary_loss, batch_size=bs)
        if self.train_mtp:
            self.log("train/mtp_loss", self.last_mtp_loss, batch_size=bs)
        if self.drafter.mtp_correction_rank:
            self.log("train/mtp_correction_loss", self.last_correction_loss, batch_size=bs)
        inj = self.drafter.injection
        first = inj.first_predicted_slot + inj.first_slot_offset
        for k in range(acc.shape[0]):   # device tensors: logging them reads nothing back before the backward
            self.log(f"train/acc_pos{first + k}", acc[k], batch_size=bs)
        self.log("train/blocks", n.float(), batch_size=bs, reduce_fx="sum")
        return loss

    # -- validation: teacher-forced loss + exact acceptance on the target's own continuations -------
    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        with gathered(self):   # the walk uses the drafter outside its forward (a no-op unless sharded)
            self._validation_step(batch, batch_idx)

    def _validation_step(self, batch, batch_idx) -> None:
        domain = batch["domain"][0] if isinstance(batch["domain"], list) else batch["domain"]
        gen = torch.Generator(device=batch["input_ids"].device).manual_seed(1234 + batch_idx)
        loss, acc, _ = self.block_loss(batch["input_ids"], batch["loss_mask"], generator=gen, step=self.global_step,
                                       cached=batch.get("features"))
        bs = batch["input_ids"].shape[0]
        self.log(f"val/{domain}/loss", loss, batch_size=bs, add_dataloader_idx=False)
        self.log(f"val/{domain}/acc_first", acc[0], batch_size=bs, add_dataloader_idx=False)
        if self.train_mtp:
            self.log(f"val/{domain}/mtp_loss", self.last_mtp_loss, batch_size=bs, add_dataloader_idx=False)
        if self.val_walk:   # across data-parallel ranks each walks its share of the rows (summed at the end)
            trainer = self._trainer
            rows, counts = walk_share(bs, trainer.global_rank if trainer else 0, trainer.world_size if trainer else 1)
            ids, prompt_len, length = (batch[k][rows.to(batch[k].device)] for k in ("input_ids", "prompt_len", "length"))
            result = exact_acceptance(self.target, self.mtp, self.drafter, ids, prompt_len, length,
                                      mtp_chain_steps=self.val_mtp_chain_steps,
                                      cached=rows_of(batch.get("features"), rows))
            self._val_results.setdefault(domain, []).append(result if counts else empty_walk(result))

    def on_validation_epoch_end(self) -> None:
        taus = []
        for domain, results in sorted(self._val_results.items()):
            taus.append(self._log_walk(f"val/{domain}/", results))
            chains = [r["mtp_chain"] for r in results if "mtp_chain" in r]
            if chains:   # the MTP chained on its own over the same sequences (mtp415 at 4 steps)
                self._log_walk(f"val/{domain}/{mtp_chain_name(self.val_mtp_chain_steps, self.train_mtp)}_", chains)
        if taus:
            self.log("val/tau", sum(taus) / len(taus), prog_bar=True)
        self._val_results = {}

    def _log_walk(self, prefix: str, results: list[dict]) -> float:
        """Log one proposer's walk over a domain, summed over the ranks' shares (tau, all-anchor tau, T1
        acceptance, P(L>=k)); -> tau."""
        trainer = self._trainer
        merged = summed_over_ranks(merged_walk(results), trainer.world_size if trainer else 1, self.device)
        hist = merged["hist"]
        tau = merged["walk_tokens"] / max(1, merged["walk_rounds"])
        self.log(f"{prefix}tau", tau, add_dataloader_idx=False)
        self.log(f"{prefix}tau_all_anchors", merged["anchor_tokens"] / max(1, merged["anchor_count"]),
                 add_dataloader_idx=False)
        total = hist.sum().clamp(min=1)
        self.log(f"{prefix}t1_accept", 1 - hist[0].item() / total.item(), add_dataloader_idx=False)
        ge = hist.flip(0).cumsum(0).flip(0) / total
        for k in range(1, len(hist)):
            self.log(f"{prefix}P(L>={k})", ge[k].item(), add_dataloader_idx=False)
        return tau

    # -- optimisation -------------------------------------------------------------------------------
    def configure_optimizers(self):
        trained = [self.drafter] + ([self.mtp] if self.train_mtp else [])
        params = [p for m in trained for p in m.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params=params)
        if self.scheduler_factory is None:
            return optimizer
        total = self.trainer.estimated_stepping_batches
        scheduler = self.scheduler_factory(optimizer=optimizer, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def mtp_chain_name(steps: int, tuned: bool = False) -> str:
    """How the walk names the MTP chained `steps` times: mtp415 (4 steps, top-1, 5 verify slots; the
    decoding method of that name), else mtp<k> (`MTPChainProposer`'s name); `_tuned` when the chain is
    the jointly trained MTP (model.train_mtp), not the target's own."""
    return ("mtp415" if steps == 4 else f"mtp{steps}") + ("_tuned" if tuned else "")


def warmup_cosine(optimizer, total_steps: int, warmup_ratio: float = 0.04, min_ratio: float = 0.1):
    """Linear warm-up, then cosine decay to `min_ratio` of the peak learning rate."""
    warmup = max(1, int(total_steps * warmup_ratio))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        frac = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _tokens_at(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """values [B, T] read at positions [B, ...] (each row at its own positions) -> positions' shape."""
    return values.gather(1, positions.flatten(1)).view_as(positions)
