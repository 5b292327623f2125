"""Data parallelism for the learner: process groups under torchrun (gloo on CPU, NCCL on GPU), FSDP2 applied per
decoder layer, and the few collectives the training step needs. A single process needs no torchrun and runs the
same code with every collective a no-op."""

from __future__ import annotations

import datetime
import logging
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from forge import variables

log = logging.getLogger(__name__)


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    timeout_s: float = 600.0        # the most a collective waits for a silent peer

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, value: float) -> float:
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return float(tensor.item())

    def max(self, value: int) -> int:
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.long, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def broadcast(self, value: Any) -> Any:
        """``value`` of rank 0, on every rank (any picklable object)."""
        if not self.enabled:
            return value
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self, failed: bool = False) -> None:
        """Leave the job; after a failed step (a peer may be gone) without the closing collectives."""
        if self.enabled and dist.is_initialized():
            if not failed:
                if dist.get_backend() == dist.Backend.GLOO:
                    self._quiesce_gloo()
                else:
                    dist.barrier()      # a rank that tears down while a peer still talks to it is aborted
            dist.destroy_process_group()

    def _quiesce_gloo(self) -> None:
        """The closing collectives under gloo: return once every rank got here and this process's gloo worker
        threads have let go of every collective, so that none of them runs Python after this.

        Why: gloo's worker threads outlive ``destroy_process_group`` (its shutdown does nothing, and FSDP2's
        DTensors keep the group alive), and a worker lets go of a collective only after its caller saw it complete;
        freeing a tensor that has a Python object takes the GIL there. A thread that asks for the GIL while the
        interpreter finalizes is ended inside a C++ destructor: "terminate called without an active exception"
        (SIGABRT) at exit. A closing ``dist.barrier()`` made that likely: a gloo barrier holds on to the
        collectives still in progress when it begins, so the last step's tensors were freed by a gloo thread when
        the barrier was, just as the process exited.

        How: a worker takes collectives in queue order and finishes one before it takes the next. Each round queues
        one collective per worker, largest first; if each completes before the one queued ahead of it, they ran on
        different workers, so every worker is past all that was queued before. A tensor's Python reference count
        stays raised while gloo holds it, which tells when the round's own collectives are let go."""
        try:
            workers = dist.group.WORLD._get_backend(torch.device("cpu")).options._threads
        except (AttributeError, RuntimeError):
            workers = 2                 # gloo's default
        deadline = time.monotonic() + self.timeout_s
        while True:
            tensors = [torch.zeros(max(1, (1 << 20) >> (10 * i))) for i in range(workers)]
            done = torch.zeros(1)
            tensors.append(done)
            alone = _references(tensors)
            works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors[:workers]]
            apart = True
            for i in reversed(range(workers)):
                works[i].wait()
                apart = apart and (i == 0 or not works[i - 1].is_completed())
            del works
            done.fill_(0.0 if apart else 1.0)
            dist.all_reduce(done, op=dist.ReduceOp.MAX)     # another round until every rank saw its workers apart
            if not _let_go(tensors, alone, deadline):
                log.warning("gloo still held a closing collective after %.0f s; leaving anyway", self.timeout_s)
                return
            if done.item() == 0.0:
                return


def _references(tensors: list[torch.Tensor]) -> list[int]:
    return [sys.getrefcount(tensor) for tensor in tensors]


def _let_go(tensors: list[torch.Tensor], alone: list[int], deadline: float) -> bool:
    """Wait until no collective holds ``tensors`` any more: until their Python reference counts are back to
    ``alone`` (while C++ code holds a tensor, the tensor holds one on its own Python object); False: not by
    ``deadline``."""
    while _references(tensors) != alone:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def init_distributed(device: str = "auto", timeout_s: float = 600.0) -> Distributed:
    """Join the torchrun job described by the environment, or run alone when there is none. A collective waits at
    most ``timeout_s`` for a silent peer."""
    world_size = int(variables.read("WORLD_SIZE"))
    local_rank = int(variables.read("LOCAL_RANK"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    target = torch.device(device)
    if target.type == "cuda":
        target = torch.device("cuda", local_rank if target.index is None else target.index)
        torch.cuda.set_device(target)
    if world_size == 1:
        return Distributed(device=target)
    dist.init_process_group("nccl" if target.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=timeout_s))
    return Distributed(dist.get_rank(), dist.get_world_size(), target, timeout_s)


def check_shared_run_dir(run_dir: Path, distributed: Distributed) -> None:
    """Every rank reads the checkpoints rank 0 writes (to resume), so the run directory must be one directory for
    all nodes: rank 0 leaves a marker there and every rank must see it. Raises a clear error on a rank that does
    not."""
    if not distributed.enabled:
        return
    name = f".shared-{uuid.uuid4().hex}" if distributed.is_main else None
    if distributed.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / name).touch()
    name = distributed.broadcast(name)
    seen = distributed.sum(float((run_dir / name).exists()))
    distributed.barrier()
    if distributed.is_main:
        (run_dir / name).unlink(missing_ok=True)
    if seen < distributed.world_size:
        raise SystemExit(f"--run-dir {run_dir} is not shared by the learner's nodes ({int(seen)} of "
                         f"{distributed.world_size} ranks see rank 0's files there): put it on storage every node "
                         f"mounts at the same path (checkpoints written by rank 0 are read by every rank to resume)")


def shard_model(model: nn.Module, distributed: Distributed) -> nn.Module:
    """FSDP2: shard every decoder layer, then the rest at the root. The root stays unsharded between forward and
    backward (the output head and MTP draft run outside ``forward``). FSDP averages gradients over ranks; the
    trainer scales its losses (already normalised by global counts) by the world size to get their sum."""
    if not distributed.enabled:
        return model
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model, reshard_after_forward=False)
    return model


def full_state_dict(model: nn.Module, distributed: Distributed) -> dict[str, torch.Tensor]:
    """The whole model's parameters as CPU tensors on rank 0 (empty elsewhere); every rank must call it."""
    if not distributed.enabled:
        return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def gathered_state_dict(model: nn.Module, distributed: Distributed, keep: Callable[[str], bool]
                        ) -> dict[str, torch.Tensor]:
    """The parameters whose names ``keep`` takes, as whole CPU tensors on rank 0 (empty elsewhere): only those
    are gathered, each on its own (every rank must call it, and does so in the same order)."""
    state = model.state_dict()
    gathered = {}
    for name, tensor in state.items():
        if not keep(name):
            continue
        whole = tensor.full_tensor() if distributed.enabled and hasattr(tensor, "full_tensor") else tensor
        if distributed.is_main:
            gathered[name] = whole.detach().cpu()
    return gathered


def split_for_ranks(lengths: list[int], world_size: int) -> list[list[int]]:
    """Indices of items per rank, balancing total length (longest first onto the least loaded rank)."""
    loads = [0] * world_size
    parts: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        parts[rank].append(index)
        loads[rank] += lengths[index]
    return parts
