"""The training loop: take a windowed-FIFO batch from the pool (consuming its entries), turn its calls into samples
with advantages, run the policy and MTP losses over micro-batches (data-parallel under FSDP2), step the optimizer,
publish the new weight version, and checkpoint together with the pool cursor."""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from forge.learner.checkpoint import Checkpointer, set_rng_state
from forge.learner.context_parallel import context_groups
from forge.learner.corrections import PreviousVersion, corrected, token_versions
from forge.learner.distill import Distillation
from forge.learner.dynamic_sampling import filled_batch
from forge.learner.expert_replay import RoutingTally
from forge.learner.lora import (
    DRAFT_PREFIX,
    LoraConfig,
    adapter_version,
    is_adapter,
    merged_state_dict,
    save_adapter,
)
from forge.learner.losses import LossConfig, check_loss_function, loss_metrics, policy_loss
from forge.learner.metrics import MetricsWriter
from forge.learner.parallel import Distributed, full_state_dict, gathered_state_dict, split_for_ranks
from forge.learner.policy import PolicyOutput, policy_forward
from forge.learner.reference import adapters_off, frozen, kl_loss
from forge.learner.rewards import RewardConfig, batch_rewards
from forge.learner.sample_table import SampleLog
from forge.learner.samples import Sample, build_samples, make_micro_batch, micro_batches
from forge.learner.step_state import StepPasses, TrainerState, dummy_sample, optimizer_bytes
from forge.learner.trainer_config import TrainerConfig
from forge.learner.tree import (
    Stem,
    StemState,
    build_trie,
    make_stem,
    pack_step,
    rank_spans,
    sharded_tree_forward,
    stem_forward,
    tree_policy_forward,
)
from forge.model.qwen3 import CausalLM
from forge.pool import Batch, PoolSource, WindowConfig, WindowedFifo
from forge.sampling.grammar import Grammars
from forge.v1 import pool_pb2

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, model: CausalLM, distributed: Distributed, config: TrainerConfig, loss: LossConfig,
                 rewards: RewardConfig, window: WindowConfig, pool: PoolSource | None,
                 checkpointer: Checkpointer | None = None, publisher: Any = None,
                 metrics: MetricsWriter | None = None, grammars: Grammars | None = None,
                 lora: LoraConfig | None = None, base_model: str | None = None,
                 sample_log: SampleLog | None = None, reference: CausalLM | None = None,
                 distillation: Distillation | None = None) -> None:
        """``grammars`` replay the structured-output calls' grammars (None: such calls are left out). ``lora``: the
        model carries those adapters (``forge.learner.lora``), trained on ``base_model``; actors and checkpoints
        get its weights merged, checkpoints the adapter too. ``sample_log`` keeps some steps' trajectories as
        text (rank 0). ``reference``: the frozen policy of the reference KL (``loss.kl_coef`` > 0, full
        fine-tuning; sharded as ``model`` is): by default, in one process, a copy of ``model`` as given; with LoRA
        the model itself with its adapters off. ``distillation``: a teacher's log-probs turn into per-token
        advantages (``forge.learner.distill``)."""
        if config.context_parallel > 1 and not config.tree:
            raise ValueError("--context-parallel splits packed trees: it needs --tree")
        if loss.function is not None:       # a team's own loss: checked on a dry batch (PluginError) before anything
            check_loss_function(loss.function)
        self.model = model
        self.context, self.dp_index, self.dp_size = context_groups(distributed, config.context_parallel)
        if config.activation_checkpointing:
            model.activation_checkpointing(True)
        self.grammars = grammars
        self.dist = distributed
        self.config = config
        self.loss = loss
        self.rewards = rewards
        self.fifo = WindowedFifo(pool, window) if pool is not None else None
        self.pool = pool
        self.checkpointer = checkpointer
        self.publisher = publisher
        self.metrics = metrics
        self.sample_log = sample_log
        self.state = TrainerState()
        self.lora = lora
        self.base_model = base_model
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.trainable_params = sum(p.numel() for p in trainable)
        self.optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
        self.last: dict[str, Any] = {}
        self.dropped_groups: list[int] = []     # consumed, not trained (dynamic sampling), since the last record
        self.reference = self._reference(reference)
        self.previous = PreviousVersion()       # the version before the current one (--recompute-behaviour)
        self.distillation = distillation

    def _reference(self, given: CausalLM | None) -> CausalLM | None:
        """The reference KL's separate frozen policy (None: off, or LoRA's base with adapters off)."""
        if self.loss.kl_coef <= 0 or self.lora is not None:
            return None
        if given is None and self.dist.enabled:
            raise ValueError("kl_coef with several ranks needs the reference policy, sharded as the model is")
        return frozen(given if given is not None else copy.deepcopy(self.model))

    # ------------------------------------------------------------------ resume

    def restore(self) -> bool:
        """Resume from the latest checkpoint (the model's weights were loaded from it already): optimizer, RNG,
        step, version, and the pool rewound to the checkpoint's cursor. False when there is none."""
        restored = self.checkpointer.latest() if self.checkpointer else None
        if restored is None:
            return False
        state = restored.state
        optimizer_state = torch.load(restored.optimizer_path, weights_only=False)
        if self.dist.enabled:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=optimizer_state,
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.optimizer.load_state_dict(optimizer_state)
        set_rng_state(state["rng"])
        # Actors may hold versions published after this checkpoint: continue past them, never reuse a number.
        version = max(state["version"], self.checkpointer.last_published() + 1)
        self.state = TrainerState(step=state["step"], version=version, pool_seq=state["pool_seq"])
        if self.dist.is_main and self.pool is not None:
            cursor = self.pool.rewind(state["pool_seq"])
            log.info("resumed from %s at step %d (version %d); pool rewound to seq %d, head %d", restored.path,
                     self.state.step, self.state.version, cursor.seq, cursor.head)
        return True

    # ------------------------------------------------------------------ one step

    def _take(self, should_stop: Callable[[], bool]) -> Batch | None:
        """Rank 0's next batch from the FIFO, its constant groups replaced with ``dynamic_sampling``."""
        if self.rewards.dynamic_sampling:
            return filled_batch(self.fifo, self.rewards, should_stop)
        return self.fifo.next_batch(should_stop)

    def _next_batch(self, should_stop: Callable[[], bool]) -> Batch | None:
        batch = self._take(should_stop) if self.dist.is_main else None
        if not self.dist.enabled:
            return batch
        payload = None if batch is None else (
            [e.SerializeToString() for e in batch.entries], batch.seq, batch.head, batch.tail, batch.window,
            batch.waited_s, batch.taken_at, batch.dropped)
        payload = self.dist.broadcast(payload)
        if payload is None:
            return None
        entries = [pool_pb2.QueueEntry.FromString(raw) for raw in payload[0]]
        return Batch(entries, *payload[1:])

    def _select(self, samples: list[Sample]) -> tuple[list[Sample], list[int]]:
        """Samples to train on, and the staleness (learner version − oldest behaviour version) of every sample."""
        staleness = [self.state.version - min(s.versions) for s in samples]
        limit = self.config.max_staleness
        if limit is not None and self.config.staleness_policy == "drop":
            kept = [s for s, age in zip(samples, staleness, strict=True) if age <= limit]
            return kept, staleness
        return samples, staleness

    def _next_samples(self, should_stop: Callable[[], bool]) -> tuple[Batch, list, list[Sample], list[int]] | None:
        """The next batch with something to train: its rewards, the samples kept and every sample's staleness. A
        batch whose samples were all too stale to keep is consumed without a step (no update, no new version)."""
        while (batch := self._next_batch(should_stop)) is not None:
            self.dropped_groups += batch.dropped
            self.state.trained_positions += batch.dropped
            rewards = batch_rewards(batch.entries, self.rewards)
            samples, staleness = self._select(build_samples(batch.entries, rewards,
                                                            tuple(self.model.config.eos_token_ids), self.grammars))
            if samples or (batch.entries and not staleness):
                return batch, rewards, samples, staleness
            self.state.trained_positions += [e.position for e in batch.entries]
            self.state.pool_seq = batch.seq
            if self.dist.is_main and not batch.entries:
                log.info("dropped %d groups whose returns were all equal; none left to train", len(batch.dropped))
            elif self.dist.is_main:
                log.info("dropped a batch of %d samples, all more than %d versions behind version %d", len(staleness),
                         self.config.max_staleness, self.state.version)
        return None

    def step(self, should_stop: Callable[[], bool] = lambda: False) -> dict[str, Any] | None:
        taken = self._next_samples(should_stop)
        if taken is None:
            return None
        batch, rewards, samples, staleness = taken
        started = time.perf_counter()
        distilled = self.distillation.apply(samples, self.dist) if self.distillation is not None else {}
        micros, stem, packed_tokens = self._micro_batches(samples)
        side = self._side_logprobs(micros, stem, samples)
        self.model.train()
        config = self.model.config
        passes = StepPasses(samples, config, self.loss, self.config.routing)
        # The ranks of a context group hold the same trees and stem: each counts a share of them.
        passes.share = 1.0 / self.context.size
        passes.computed = max(1.0, self.dist.sum(float(packed_tokens + (stem.num_nodes if stem is not None else 0)))
                              * passes.share)
        state: StemState | None = None
        if stem is not None:        # each rank of a context group computes its share of every piece
            state = self._stem_state(self.model, stem, passes.mtp_k,
                                     passes.balance * stem.num_nodes / passes.computed * self.dist.world_size)
            for routing in state.routings:
                passes.tally.add(routing)
        for index, micro in enumerate(micros):
            self._train_micro(passes, micro, state, side[0][index] if side[0] else None,
                              side[1][index] if side[1] else None)
        if state is not None:
            state.backward()        # the stem's share, summed over the trees that borrowed from it
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        if self.config.recompute_behaviour:
            self.previous.keep(self.model, self.state.version)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.version += 1
        self.state.trained_positions += [e.position for e in batch.entries]
        train_s = time.perf_counter() - started

        self.state.pool_seq = batch.seq
        share = passes.share
        record = self._record(batch, rewards, samples, staleness, passes.figures, grad_norm, train_s,
                              policy_sum=self.dist.sum(passes.policy_sum), mtp_sum=self.dist.sum(passes.mtp_sum),
                              packed_tokens=round(self.dist.sum(float(packed_tokens)) * share),
                              stem_tokens=round(self.dist.sum(float(stem.num_nodes if stem is not None else 0)) * share))
        record["stem_rank_tokens"] = self.dist.max(state.computed_rows if state is not None else 0)
        record.update(self._mismatch_record(passes, samples))
        record.update(distilled)
        record["loss"] += self.loss.kl_coef * record.get("ref_kl", 0.0)
        if config.sparse_layers:           # the same on every rank: the collectives run everywhere or nowhere
            sums = {name: self.dist.sum(value) for name, value in passes.tally.sums().items()}
            sums["load_max"] /= self.dist.world_size
            record.update(passes.tally.figures(sums))
        self.last = record
        self.dropped_groups = []
        if self.metrics is not None and self.dist.is_main:
            self.metrics.write(record)      # before the checkpoint: a redone step rewrites its record
        if self.sample_log is not None and self.dist.is_main:
            self.sample_log.write(self.state.step, self.state.version - 1, batch.entries, rewards)
        if (self.publisher is not None or self.dist.enabled) and self.state.step % self.config.publish_every == 0:
            self._publish()
        if self.state.step % self.config.checkpoint_every == 0:
            self.save_checkpoint()
        return record

    def _forward(self, model: CausalLM, micro: Any, mtp_k: int, state: StemState | None,
                 keep_router_logits: bool = False) -> PolicyOutput:
        """A micro-batch's pass, the step's way: a tree sharded over the context group, a packed tree, or padded."""
        if self.context.enabled:
            return sharded_tree_forward(model, micro, self.context, mtp_k, stem=state,
                                        routing_mode=self.config.routing, keep_router_logits=keep_router_logits)
        if self.config.tree:
            return tree_policy_forward(model, micro, mtp_k, stem=state, routing_mode=self.config.routing,
                                       keep_router_logits=keep_router_logits)
        return policy_forward(model, micro, mtp_k, self.config.routing, keep_router_logits=keep_router_logits)

    def _stem_state(self, model: CausalLM, stem: Stem, mtp_k: int, balance_weight: float = 0.0) -> StemState:
        return stem_forward(model, stem, mtp_k, routing_mode=self.config.routing, balance_weight=balance_weight,
                            piece_tokens=self.config.micro_batch_tokens, group=self.context,
                            passes=self.dist.max(stem.piece_count(self.config.micro_batch_tokens)))

    @torch.no_grad()
    def _logprobs_pass(self, model: CausalLM, micros: list[Any], stem: Stem | None) -> list[torch.Tensor]:
        """Every micro-batch's log-probs under ``model`` (no gradient), computed as the training pass computes them
        (the same trees, stem and routing)."""
        state = self._stem_state(model, stem, 0) if stem is not None else None
        return [self._forward(model, micro, 0, state).logprobs.detach() for micro in micros]

    def _side_logprobs(self, micros: list[Any], stem: Stem | None, samples: list[Sample]
                       ) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """Per micro-batch, the reference's log-probs (with ``kl_coef``) and the learner's at the previous version
        (with ``recompute_behaviour``, where the step has tokens sampled at it), else None."""
        reference = previous = None
        self.model.eval()
        if self.loss.kl_coef > 0:
            if self.reference is not None:
                reference = self._logprobs_pass(self.reference, micros, stem)
            else:                           # LoRA: the base is the model with its adapters off
                with adapters_off(self.model):
                    reference = self._logprobs_pass(self.model, micros, stem)
        held = self.previous.version
        if (self.config.recompute_behaviour and held is not None and held != self.state.version
                and any(held in s.versions for s in samples)):
            with self.previous.held(self.model):
                previous = self._logprobs_pass(self.model, micros, stem)
        return reference, previous

    def _learner_side(self, micro: Any, current: torch.Tensor, previous: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The learner's log-probs of a micro-batch's terms at their sampling versions where it holds them (the
        current version's pass, the previous version's), else the current policy's; and which terms fell back."""
        versions = token_versions(micro.samples, micro.num_tokens, self.state.version).to(current.device)
        side = current.detach()
        own = versions == self.state.version
        if previous is not None:
            at_previous = versions == self.previous.version
            side = torch.where(at_previous, previous, side)
            own = own | at_previous
        return side, ~own

    def _train_micro(self, passes: StepPasses, micro: Any, state: StemState | None, reference: torch.Tensor | None,
                     previous: torch.Tensor | None) -> None:
        """One micro-batch's forward and backward: policy loss (corrected), reference KL, MTP and balance terms."""
        real = micro.samples[0].position >= 0
        out = self._forward(self.model, micro, passes.mtp_k, state, passes.balance > 0)
        mask = torch.ones_like(out.logprobs)
        side, fell_back = self._learner_side(micro, out.logprobs, previous)
        old, advantages = corrected(self.loss, side, micro.old_logprobs, micro.advantages, mask, micro.sample_index)
        policy = policy_loss(self.loss, out.logprobs, old, advantages, mask, micro.sample_index, passes.tokens,
                             passes.sequences)
        loss = policy
        kl = None
        if reference is not None:
            kl = kl_loss(self.loss, out.logprobs, reference, mask, micro.sample_index, passes.tokens,
                         passes.sequences)
            loss = loss + self.loss.kl_coef * kl
        mtp = out.mtp_kl.sum() / passes.mtp_tokens if out.mtp_kl is not None else None
        loss = loss if mtp is None else loss + self.loss.mtp_weight * mtp
        loss = loss + self._balance_term(out, passes.tally, passes.balance, passes.computed, real)
        if real:                # the loss of the whole tree, on every rank of its context group
            share = passes.share
            passes.policy_sum += float(policy.detach()) * share
            passes.mtp_sum += float(mtp.detach()) * share if mtp is not None else 0.0
            passes.kl_sum += float(kl.detach()) * share if kl is not None else 0.0
            passes.figures.append(loss_metrics(out.logprobs.detach(), old, mask, self.loss, micro.sample_index)
                                  | {"count": float(micro.num_tokens)})
            passes.mismatch.add(side, micro.old_logprobs, [s.domain for s in micro.samples], micro.sample_index,
                                fell_back, share)
        # FSDP averages gradients over ranks: scale back to their sum (the losses use global counts).
        (loss * (self.dist.world_size if real else 0.0)).backward()

    def _mismatch_record(self, passes: StepPasses, samples: list[Sample]) -> dict[str, float]:
        """The reference KL and the mismatch figures, summed over the ranks."""
        keys = passes.mismatch.keys([s.domain for s in samples])
        totals = {key: self.dist.sum(passes.mismatch.sums[key[0]][key[1]] if key[0] in passes.mismatch.sums
                                     else 0.0) for key in keys}
        record = passes.mismatch.figures(totals)
        if self.loss.kl_coef > 0:
            record["ref_kl"] = self.dist.sum(passes.kl_sum)
        return record

    def _balance_term(self, out: PolicyOutput, tally: RoutingTally, weight: float, computed: float,
                      real: bool) -> torch.Tensor | float:
        """Tally a pass's routing (a real micro-batch's) and return its share of the load-balancing loss: the
        pass's loss weighted by its tokens' share of the tokens the step computes."""
        if real:
            tally.add(out.routing, out.tokens)
        aux = tally.balance_loss(out.routing, out.tokens) if weight > 0 else None
        if aux is None:
            return 0.0
        tokens = float(out.tokens.sum()) if out.tokens is not None else float(out.routing.logits[0].shape[0])
        return weight * aux * (tokens / computed) * (1.0 if real else 0.0)

    def learning_rate(self) -> float:
        """The rate of the coming step: a linear warm-up over the first ``warmup_steps`` steps (from the step
        count alone, so a resumed run continues the schedule)."""
        warmup = self.config.warmup_steps
        return self.config.lr * (min(1.0, (self.state.step + 1) / warmup) if warmup else 1.0)

    def _micro_batches(self, samples: list[Sample]) -> tuple[list[Any], Stem | None, int]:
        """This rank's micro-batches (packed trees, or padded linear batches), padded with zero-weight dummies to
        the same count on every rank; the trees' stem (a one-token dummy where another rank has a stem and this
        one has none, so every rank runs the same passes); and the number of real tokens the model runs over."""
        world, budget, device = self.dist.world_size, self.config.micro_batch_tokens, self.dist.device
        stem = None
        if self.config.tree:        # one trie per step: split into data-parallel spans of its sorted samples, packed
            # With routing replay, samples merge only where their recorded routing agrees too.
            trie = build_trie([s.tokens for s in samples], [s.routing for s in samples],
                              split_by_routing=self.config.routing == "replay")
            span = rank_spans(trie, self.dp_size)[self.dp_index]      # a context group's ranks share theirs
            step = pack_step(samples, budget, device, trie, span, share=self.config.tree_stem)
            micros: list[Any] = step.batches
            stem, packed = step.stem, step.num_nodes
            if self.dist.max(int(stem is not None)) and stem is None:      # the collective runs on every rank
                stem = make_stem(build_trie([[0]]), np.zeros(1, dtype=np.int64), device)
        else:
            local = [samples[i] for i in split_for_ranks([len(s.tokens) for s in samples], world)[self.dist.rank]]
            micros = [make_micro_batch(group, device) for group in micro_batches(local, budget)]
            packed = sum(len(s.tokens) for s in local)
        missing = self.dist.max(len(micros)) - len(micros)
        if missing:
            dummy = [dummy_sample()]
            micros += [pack_step(dummy, budget, device).batches[0] if self.config.tree
                       else make_micro_batch(dummy, device)] * missing
        return micros, stem, packed

    def weights(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The policy's weights as actors and checkpoints hold them (adapters merged), gathered on rank 0 (empty on
        the others); every rank calls this. ``state``: the full state dict, when gathered already."""
        state = full_state_dict(self.model, self.dist) if state is None else state
        return merged_state_dict(state, self.lora) if self.lora is not None and state else state

    def published(self) -> dict[str, torch.Tensor]:
        """What a version sends the actors, gathered on rank 0 (empty on the others; every rank calls this): the
        weights, or with LoRA publishing adapters, the adapter version (``forge.model.lora_weights``)."""
        if self.lora is None or self.lora.publish == "merged":
            return self.weights()
        state = gathered_state_dict(self.model, self.dist, lambda name: is_adapter(name) or name.startswith(
            DRAFT_PREFIX))                      # the adapters and the draft alone cross the ranks
        return adapter_version(state, self.lora) if self.dist.is_main else state

    def _publish(self) -> None:
        state = self.published()
        if self.dist.is_main and self.publisher is not None:
            self.publisher.publish(self.state.version, state)
            if self.checkpointer is not None:
                self.checkpointer.record_published(self.state.version)

    def save_checkpoint(self) -> None:
        """Every rank calls this; rank 0 writes, then commits the pool cursor up to the saved seq."""
        if self.checkpointer is None:
            return
        full_state = full_state_dict(self.model, self.dist)
        model_state = self.weights(full_state)
        if self.dist.enabled:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            optimizer_state = get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True))
        else:
            optimizer_state = self.optimizer.state_dict()
        if self.dist.is_main:
            state = {"version": self.state.version, "pool_seq": self.state.pool_seq,
                     "trained_positions": self.state.trained_positions, "saved_at": time.time()}
            adapter = None if self.lora is None else partial(save_adapter, config=self.lora, state=full_state,
                                                             base_model=self.base_model)
            self.checkpointer.save(self.state.step, self.model.config, model_state, optimizer_state, state, adapter)
            if self.pool is not None:
                self.pool.commit_cursor(self.state.pool_seq)
        self.state.trained_positions = []
        self.dist.barrier()

    def _record(self, batch: Batch, rewards: list, samples: list[Sample], staleness: list[int],
                figures: list[dict[str, float]], grad_norm: torch.Tensor, train_s: float, policy_sum: float,
                mtp_sum: float, packed_tokens: int, stem_tokens: int) -> dict[str, Any]:
        tokens = sum(s.num_completion for s in samples)
        sample_tokens = sum(len(s.tokens) for s in samples)
        by_domain: dict[str, list[float]] = defaultdict(list)
        for r in rewards:
            by_domain[r.domain or "default"].append(r.outcome)
        counted = sum(f["count"] for f in figures) or 1.0

        def weighted(key: str) -> float:
            return self.dist.sum(sum(f[key] * f["count"] for f in figures)) / self.dist.sum(counted)

        record: dict[str, Any] = {
            "step": self.state.step, "version": self.state.version, "time": time.time(),
            "loss": policy_sum + self.loss.mtp_weight * mtp_sum, "policy_loss": policy_sum, "mtp_loss": mtp_sum,
            "grad_norm": float(grad_norm), "lr": self.optimizer.param_groups[0]["lr"],
            "trainable_params": self.trainable_params, "optimizer_mb": optimizer_bytes(self.optimizer) / 2**20, "groups": len(batch.entries), "sessions": len(rewards),
            "samples": len(samples), "tokens": tokens, "tokens_per_s": tokens / max(train_s, 1e-9),
            "step_s": train_s, "waited_s": batch.waited_s, "window": batch.window, "head": batch.head,
            "tail": batch.tail, "pool_seq": self.state.pool_seq,
            "reward_mean": statistics.fmean(r.outcome for r in rewards) if rewards else 0.0,
            "staleness_mean": statistics.fmean(staleness) if staleness else 0.0,
            "staleness_max": max(staleness, default=0),
            "dropped_stale": len(staleness) - len(samples) if self.config.staleness_policy == "drop" else 0,
            "dropped_groups": len(self.dropped_groups), "dropped_positions": self.dropped_groups,
            "positions": [e.position for e in batch.entries],
            "taken_at": batch.taken_at,     # (head, window) when each entry was taken
            "ratio_mean": weighted("ratio_mean"), "clip_frac": weighted("clip_frac"),
            "approx_kl": weighted("approx_kl"),
            "sample_tokens": sample_tokens, "packed_tokens": packed_tokens, "stem_tokens": stem_tokens,
            "tree_compression": sample_tokens / max(1, packed_tokens),
        }
        for domain, values in by_domain.items():
            record[f"reward/{domain}"] = statistics.fmean(values)
            record[f"sessions/{domain}"] = len(values)
        return record

    def _stopping(self, should_stop: Callable[[], bool]) -> bool:
        """Whether any rank was asked to stop: ranks signalled at different moments still stop at the same step."""
        return self.dist.max(int(should_stop())) > 0

    def run(self, should_stop: Callable[[], bool] = lambda: False,
            on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        while not self._stopping(should_stop) and not (self.config.max_steps
                                                        and self.state.step >= self.config.max_steps):
            record = self.step(should_stop)
            if record is None:
                break
            if on_step is not None:
                on_step(record)
