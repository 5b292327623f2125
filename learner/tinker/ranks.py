"""forge-tinker's training on several ranks (``--nproc N``, under torchrun: gloo on CPU, NCCL on GPUs). Rank 0 is the
server: HTTP, sessions, futures, the sampling publisher, and the one training worker, which calls ``RankedTraining``;
every other rank runs ``follow``, a loop that takes rank 0's operations one at a time and runs its part of each.

Every ``Training`` call that touches the models runs on every rank, in rank 0's order: rank 0 first checks the request
whole (``UserError``, nothing sent, when it is wrong: a bad request never reaches another rank), then broadcasts the
operation and its small arguments (``broadcast_object_list``), and every rank, rank 0 included, runs it
(``RankTraining.op_*``). A ``forward_backward`` batch's datums are split by the prefix trie (``rank_spans``: datums
that share a prefix stay on one rank, where the prefix is computed once) and scattered, each rank packs and runs its
share, and the per-datum outputs (log-probabilities, elementwise losses) come back to rank 0 in datum order, the
metrics summed. Calls that read files or the registry alone (model infos, checkpoint lists, sampler weights) and the
writing of checkpoints are rank 0's.

How the model is spread: the frozen base model is sharded with FSDP2 (``shard_model``: each decoder layer, then the
root), the same as the learner's; each client's LoRA adapter is added later, at run time, by peft inside the sharded
layers (``peft.inject_adapter_in_model`` wraps a layer's ``nn.Linear``, whose weight FSDP2 gathers before the layer
runs, in a ``LoraLayer`` that calls it), so the adapters are ordinary parameters that FSDP2 does not manage: every
rank holds each adapter whole, as small as it is, and its optimizer state. Sharding the adapters too would mean
re-sharding a layer each time a client creates or unloads a model; replicated, they need no more than this: their
gradients are summed over the ranks before ``optim_step`` (the base gets none), so N ranks take the step one rank
takes on the whole batch, every rank the same step; and rank 0 holds every adapter and optimizer state whole, so it
writes checkpoints without a gather, while every rank loads them (the run directory is this machine's). A model put
on its base (created, or back after a restart) gets rank 0's adapter weights by broadcast, whatever its seed.

Every rank must run as many FSDP passes as the others in a forward: a rank with a smaller share runs idle passes
(``packed_forward``). After each operation the ranks agree on whether it failed: everywhere (a mistake rank 0's checks
missed) is the client's error; on some ranks and not others, or a rank gone (a collective fails at once) or silent
(``--collective-timeout-s``), is fatal: the server stops with the reason in its log and torchrun ends the job. While
no call comes, rank 0 sends a heartbeat, so an idle server outlives the collectives' timeout.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from forge.learner.parallel import Distributed, shard_model
from forge.learner.tinker.adapters import SharedBase
from forge.learner.tinker.training import LearnerTraining, LoadedModel, _check_adam, _per_datum, checked_prompt
from forge.learner.tinker.types import (
    AdamSpec,
    Checkpoint,
    Datum,
    ForwardResult,
    LoraSpec,
    ModelInfo,
    Training,
    UserError,
)
from forge.learner.tree import build_trie, rank_spans

log = logging.getLogger(__name__)
STOP, BEAT = "stop", "beat"


class RanksFailed(RuntimeError):
    """The training ranks no longer agree (one died, went silent, or failed where the others did not)."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def split_datums(data: list[Datum], world_size: int) -> list[list[int]]:
    """Per rank, the indices of its datums: contiguous runs of the batch's prefix trie, balanced by the tokens each
    rank computes, so that datums sharing a prefix share it on one rank."""
    trie = build_trie([[int(t) for t in d.tokens] for d in data])
    return [sorted(int(i) for i in trie.order[a:b]) for a, b in rank_spans(trie, world_size)]


def _flat(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(device, torch.float32) for t in tensors])


def _unflat(flat: torch.Tensor, into: list[torch.Tensor]) -> None:
    start = 0
    for tensor in into:
        tensor.copy_(flat[start:start + tensor.numel()].view_as(tensor))
        start += tensor.numel()


class RankTraining(LearnerTraining):
    """One rank's models: ``LearnerTraining`` whose bases are sharded over the ranks, whose adapters' gradients are
    summed over them before a step, and whose ``op_*`` methods are each rank's part of an operation (rank 0's
    ``RankedTraining`` has checked it first). Only rank 0 writes the run directory."""

    def __init__(self, run_dir: Path, distributed: Distributed, **kwargs: Any) -> None:
        super().__init__(run_dir, distributed=distributed, **kwargs)
        self.sharded: set[int] = set()

    def _base(self, base_model: str) -> SharedBase:
        base = super()._base(base_model)
        if id(base) not in self.sharded:
            shard_model(base.policy, self.distributed)
            self.sharded.add(id(base))
        return base

    def _share_adapter(self, model_id: str) -> None:
        """Rank 0's weights of ``model_id``'s adapter on every rank."""
        if not self.distributed.enabled:
            return
        parameters = [p.data for p in self.loaded[model_id].base.parameters(model_id).values()]
        flat = _flat(parameters, self.distributed.device)
        dist.broadcast(flat, src=0)
        _unflat(flat, parameters)

    def _sum_gradients(self, model_id: str) -> None:
        """The adapter's gradients summed over the ranks (a parameter no rank has a gradient for keeps none)."""
        if not self.distributed.enabled:
            return
        parameters = list(self.loaded[model_id].base.parameters(model_id).values())
        device = self.distributed.device
        has = torch.tensor([float(p.grad is not None) for p in parameters], device=device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        chosen = [p for p, flag in zip(parameters, has.tolist(), strict=True) if flag]
        for parameter in chosen:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
        if chosen:
            flat = _flat([p.grad for p in chosen], device)
            dist.all_reduce(flat)
            _unflat(flat, [p.grad for p in chosen])

    # Each rank's part of an operation (same arguments on every rank).
    def op_base(self, base_model: str) -> None:
        with self.lock:
            self._base(base_model)

    def op_adopt(self, owner: str, base_model: str, lora: LoraSpec, model_id: str) -> None:
        """The model rank 0 created (or put back on its base): on every rank, with rank 0's adapter weights."""
        with self.lock:
            if model_id not in self.loaded:          # rank 0 has it already
                if model_id in self.infos:
                    self._model(model_id)
                else:
                    base = self._base(base_model)
                    base.add(model_id, lora)
                    self.infos[model_id] = self._describe(model_id, owner, base_model, lora)
                    self.loaded[model_id] = LoadedModel(base)
            self._share_adapter(model_id)

    def op_unload(self, model_id: str) -> None:
        self.unload(model_id)

    def op_forward(self, model_id: str, loss_fn: str, loss_fn_config: dict[str, float] | None, backward: bool,
                   data: list[Datum] | None) -> ForwardResult | None:
        """Rank 0 gives ``data`` and gets the result; every rank runs the share it is sent."""
        with self.lock:
            d = self.distributed
            shares = None
            if d.is_main:
                assert data is not None
                shares = [[(i, data[i]) for i in part] for part in split_datums(data, d.world_size)]
            box: list[Any] = [None]
            dist.scatter_object_list(box, shares, src=0)
            own: list[tuple[int, Datum]] = box[0]
            mine = [datum for _, datum in own]
            logprobs, losses = self.forward_terms(model_id, mine, loss_fn, loss_fn_config, backward)
            local = ([i for i, _ in own], _per_datum(mine, logprobs, losses) if mine else [],
                     float(losses.astype(np.float64).sum()))
            gathered: list[Any] | None = [None] * d.world_size if d.is_main else None
            dist.gather_object(local, gathered, dst=0)
            if not d.is_main:
                return None
            assert data is not None and gathered is not None
            outputs: list[dict[str, np.ndarray] | None] = [None] * len(data)
            for indices, per_datum, _ in gathered:
                for index, output in zip(indices, per_datum, strict=True):
                    outputs[index] = output
            return ForwardResult(outputs=outputs, metrics={"loss:sum": sum(part[2] for part in gathered)})

    def op_optim_step(self, model_id: str, adam: AdamSpec) -> dict[str, float]:
        with self.lock:
            self._model(model_id)
            self._sum_gradients(model_id)
            return self.optim_step(model_id, adam)

    def op_load_state(self, model_id: str, path: str, with_optimizer: bool) -> None:
        self.load_state(model_id, path, with_optimizer)

    def op_prompt_logprobs(self, base_model: str, sampler_path: str | None, tokens: list[int], top_k: int) -> Any:
        return self.prompt_logprobs(base_model, sampler_path, tokens, top_k)


class RankedTraining(Training):
    """Rank 0's ``Training`` over every rank's ``RankTraining`` (see the module's docstring). ``on_failure(reason)``
    is called once when the ranks fail; every later call fails at once."""

    def __init__(self, training: RankTraining, on_failure: Callable[[str], None] | None = None) -> None:
        self.training = training
        self.dist = training.distributed
        self.on_failure = on_failure
        self.failure: str | None = None
        self.lock = threading.Lock()              # one operation's collectives at a time
        self.last_sent = time.monotonic()
        self.closed = threading.Event()
        self.beat_every = min(60.0, self.dist.timeout_s / 4)
        self._beats = threading.Thread(target=self._beat, name="tinker-ranks-heartbeat", daemon=True)
        self._beats.start()

    # The protocol.
    def _send(self, message: tuple) -> None:
        self.dist.broadcast(message)
        self.last_sent = time.monotonic()

    def _everywhere(self, op: str, *args: Any, here: bool = True) -> Any:
        """Run ``op`` on every rank (on rank 0 too unless ``here`` is False: it did its part already) and agree on
        the outcome: rank 0's result, or the error every rank raised; a disagreement is fatal."""
        with self.lock:
            if self.failure is not None:
                raise RanksFailed(self.failure)
            error: Exception | None = None
            result = None
            try:
                self._send((op, args))
                if here:
                    try:
                        result = getattr(self.training, f"op_{op}")(*args)
                    except Exception as exc:          # the ranks compare outcomes below
                        error = exc
                failed = int(self.dist.sum(float(error is not None)))
            except Exception as exc:
                raise self._fail(f"{op}: {first_line(exc)}") from exc
            if failed == 0:
                return result
            if error is not None and failed == self.dist.world_size:
                raise error
            raise self._fail(f"{op} failed on {failed} of {self.dist.world_size} ranks"
                             + (f" (rank 0: {error})" if error is not None else " (not rank 0)")) from error

    def _fail(self, reason: str) -> RanksFailed:
        if self.failure is None:
            self.failure = (f"the training ranks failed ({reason}): the server stops; see each rank's log, start it "
                            "again (saved checkpoints are kept)")
            log.error("%s", self.failure)
            if self.on_failure is not None:
                self.on_failure(self.failure)
        return RanksFailed(self.failure)

    def _beat(self) -> None:
        """While no operation comes, tell the other ranks every so often that rank 0 is alive (their wait for the
        next operation is a collective, bound by its timeout)."""
        while not self.closed.wait(self.beat_every / 4):
            if time.monotonic() - self.last_sent < self.beat_every or not self.lock.acquire(timeout=1):
                continue
            try:
                if self.failure is None and not self.closed.is_set():
                    self._send((BEAT, ()))
            except Exception as exc:              # reported as the ranks' failure
                self._fail(f"heartbeat: {first_line(exc)}")
            finally:
                self.lock.release()

    def _ensure_loaded(self, model_id: str) -> LoadedModel:
        """``model_id`` on its base on every rank (put back after a restart or an unload), NotFound if unknown."""
        info = self.training.model_info(model_id)
        if model_id not in self.training.loaded:
            self._ensure_base(info.base_model)
            self._everywhere("adopt", info.owner, info.base_model, info.lora, model_id)
        return self.training.loaded[model_id]

    def _ensure_base(self, base_model: str) -> SharedBase:
        """The base ``base_model`` names, loaded on every rank (UserError on rank 0, nothing sent, when it cannot be
        found)."""
        from forge.checkpoints.reference import ModelNotFound, resolve_model

        try:
            key = resolve_model(base_model).model_id
        except ModelNotFound as exc:
            raise UserError(f"base model {exc}") from None
        if key not in self.training.bases:
            self._everywhere("base", base_model)
        return self.training.bases[key]

    # Training.
    def create_model(self, owner: str, base_model: str, lora: LoraSpec) -> ModelInfo:
        if not isinstance(base_model, str) or not base_model:
            raise UserError("base_model must name a model")
        self._ensure_base(base_model)
        info = self.training.create_model(owner, base_model, lora)     # checked, made and recorded on rank 0
        self._everywhere("adopt", owner, base_model, info.lora, info.model_id)
        return info

    def model_info(self, model_id: str) -> ModelInfo:
        return self.training.model_info(model_id)

    def models(self, owner: str) -> list[ModelInfo]:
        return self.training.models(owner)

    def unload(self, model_id: str) -> None:
        self.training.model_info(model_id)
        if model_id in self.training.loaded:
            self._everywhere("unload", model_id)

    def forward(self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
                backward: bool) -> ForwardResult:
        self.training.model_info(model_id)
        self._ensure_loaded(model_id)
        with self.training.lock:
            self.training.check_forward(model_id, data, loss_fn, loss_fn_config)
        return self._everywhere("forward", model_id, loss_fn, loss_fn_config, backward, data)

    def optim_step(self, model_id: str, adam: AdamSpec) -> dict[str, float]:
        self.training.model_info(model_id)
        _check_adam(adam)
        self._ensure_loaded(model_id)
        return self._everywhere("optim_step", model_id, adam)

    def save_state(self, model_id: str, name: str | None) -> Checkpoint:
        self._ensure_loaded(model_id)
        return self.training.save_state(model_id, name)        # rank 0 holds the adapter and optimizer whole

    def save_sampler(self, model_id: str, name: str | None) -> Checkpoint:
        self._ensure_loaded(model_id)
        return self.training.save_sampler(model_id, name)

    def load_state(self, model_id: str, path: str, with_optimizer: bool) -> None:
        self._ensure_loaded(model_id)
        self.training.load_state(model_id, path, with_optimizer)     # rank 0 checks and loads first
        self._everywhere("load_state", model_id, path, with_optimizer, here=False)

    def sampler_weights(self, path: str) -> tuple[ModelInfo, dict[str, object]]:
        return self.training.sampler_weights(path)

    def checkpoints(self, model_id: str) -> list[Checkpoint]:
        return self.training.checkpoints(model_id)

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None:
        self.training.delete_checkpoint(model_id, checkpoint_id)

    def prompt_logprobs(self, base_model: str, sampler_path: str | None, tokens: list[int],
                        top_k: int = 0) -> tuple[list[float | None], list[list[tuple[int, float]] | None] | None]:
        if sampler_path is not None:
            model_id, _, _ = self.training.store.find(sampler_path)
            base_model = self.training.model_info(model_id).base_model
        base = self._ensure_base(base_model)
        checked_prompt(tokens, top_k, base.vocab_size)
        return self._everywhere("prompt_logprobs", base_model, sampler_path, list(tokens), top_k)

    def close(self) -> None:
        """Stop the other ranks (they leave their loop) and leave the job."""
        self.closed.set()
        self._beats.join(5)
        with self.lock:
            failed = self.failure is not None
            if not failed:
                try:
                    self._send((STOP, ()))
                except Exception as exc:          # a rank already gone
                    self._fail(f"stop: {first_line(exc)}")
                    failed = True
            self.dist.close(failed=failed)


def follow(training: RankTraining) -> None:
    """A rank > 0: run rank 0's operations until it says stop. Returns normally on stop; raises when the job
    fails (a collective error: rank 0 or another rank gone or silent)."""
    d = training.distributed
    while True:
        op, args = d.broadcast(None)
        if op == STOP:
            return
        if op == BEAT:
            continue
        error = None
        try:
            getattr(training, f"op_{op}")(*args)
        except Exception as exc:                  # the ranks compare outcomes below
            error = exc
            log.debug("rank %d: %s failed: %s", d.rank, op, exc)
        if d.sum(float(error is not None)) and error is None:
            log.warning("rank %d: %s failed on another rank", d.rank, op)


def ignore_stop_signals(rank: int) -> None:
    """A rank > 0 stops when rank 0 tells it to (after the server stopped), not on SIGTERM or SIGINT (which reach
    every rank): torchrun would take a rank that left first for a failed one and end the job."""
    def handle(signum: int, _frame: object) -> None:
        log.info("rank %d: %s received; waiting for rank 0 to stop the job", rank, signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)

