"""Sampling for Forge's Tinker server through Forge's actors (``ActorSampling``, the server's ``Sampling``).

A client samples with the sampler weights it saved (a LoRA adapter on the actors' base model) or with the base model
itself. The server publishes the adapters being sampled as one *adapter source* (``forge.model.adapter_bundle``):
a ``WeightPublisher`` on ``fetch``/``announce`` whose every version is the set of adapters to serve now, which the
actors follow (``forge-actor --adapter-source FETCH,ANNOUNCE``): they load what is new, drop what is gone.

The set holds at most what the actors serve at once (the least of their ``adapter_source_capacity`` gauges, or
``max_adapters``); to make room, the least recently used adapter no sample is using is evicted, and published again
when it is sampled again (``learner.tinker.adapter_set``). A sample waits for the event, not for time: every actor
it goes to reports, in its Stats, the newest source version it has applied, and the sample is sent once that version
holds its adapter. Each sample is one ``Generate`` call (``learner.tinker.actor_generate``), spread over the actors
in turn; a request's samples are sent together, and the actors batch them."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import grpc

from forge.learner.tinker.actor_generate import AdapterMissing, generate, sampling_message
from forge.learner.tinker.adapter_set import AdapterSet, PublishedAdapter, VersionClock
from forge.learner.tinker.types import SampledSequence, SampleParams, Sampling, Training, UserError
from forge.model.lora_weights import PEFT_PREFIX, SCALING
from forge.rpc.auth import bearer_metadata
from forge.rpc.client import check_address
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20),
                   ("grpc.keepalive_time_ms", 30_000)]
STATS_TIMEOUT_S = 10.0


def adapter_version_of(tensors: Mapping[str, Any]) -> dict[str, Tensor]:
    """Sampler weights as an adapter version (``forge.model.lora_weights``), contiguous on the host: names as peft
    saves them are taken too; RuntimeError without the adapters' scale."""
    import numpy as np
    import torch

    version = {}
    for key, value in tensors.items():
        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
        key = key.removeprefix(PEFT_PREFIX).replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.",
                                                                                          ".lora_B.")
        version[key] = tensor.detach().to("cpu").contiguous()
    if SCALING not in version:
        raise RuntimeError(f"the sampler weights carry no {SCALING!r} (the adapters' alpha / rank): they cannot be "
                           "served")
    return version


class ActorSampling(Sampling):
    """Samples on ``actors`` (host:port, each following this sampler's adapter source), publishing the sampler
    weights they need on ``fetch`` and ``announce`` (``tcp://host:*`` binds a free port: ``fetch_endpoint`` and
    ``announce_endpoint`` hold the bound ones). ``curve``: the publisher's ``forge.weights.curve.ServerKeys``."""

    def __init__(self, training: Training, actors: tuple[str, ...], actor_api_key: str | None, fetch: str,
                 announce: str, *, curve: Any = None, max_adapters: int | None = None,
                 ready_timeout_s: float = 300.0, poll_s: float = 0.02) -> None:
        from forge.weights import WeightPublisher

        if not actors:
            raise ValueError("give at least one actor address")
        for address in actors:
            check_address(address)
        if max_adapters is not None and max_adapters < 1:
            raise ValueError(f"max_adapters must be 1 or more, got {max_adapters}")
        self.training = training
        self.actors = tuple(actors)
        self.max_adapters = max_adapters
        self.ready_timeout_s = ready_timeout_s
        self.poll_s = poll_s
        self._metadata = bearer_metadata(actor_api_key)
        self._publisher = WeightPublisher(fetch, announce, curve=curve)
        self._clock = VersionClock()
        self._set: AdapterSet | None = None
        self._applied: dict[str, int] = {}          # actor -> the newest source version it reported applied
        self._turn = itertools.count()
        self._tokenizers: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: dict[str, actor_pb2_grpc.ActorStub] = {}
        self._changed: asyncio.Condition | None = None

    @property
    def fetch_endpoint(self) -> str:
        return self._publisher.fetch_endpoint

    @property
    def announce_endpoint(self) -> str:
        return self._publisher.announce_endpoint

    @property
    def published(self) -> dict[str, str]:
        """The sampler paths published now and the adapter name each is served under."""
        return {} if self._set is None else self._set.names()

    async def sample(self, base_model: str, sampler_path: str | None, prompt: list[int], num_samples: int,
                     params: SampleParams) -> list[SampledSequence]:
        if num_samples < 1:
            raise UserError(f"num_samples must be 1 or more, got {num_samples}")
        messages = [sampling_message(params, index) for index in range(num_samples)]     # refused before anything
        self._bind_loop()
        start = next(self._turn)
        targets = [self.actors[(start + index) % len(self.actors)] for index in range(num_samples)]
        adapter = None if sampler_path is None else await self._acquire(sampler_path)
        try:
            decode = None
            if params.stop_strings:
                reference = adapter.info.tokenizer_id if adapter is not None and adapter.info else base_model
                decode = (await self._tokenizer(reference)).decode
            requests = [actor_pb2.GenerateRequest(prompt_ids=prompt, sampling=message,
                                                  adapter=adapter.name if adapter is not None else "")
                        for message in messages]
            return await self._sample_on(targets, requests, adapter, params.stop_strings, decode)
        finally:
            if adapter is not None:
                await self._release(adapter)

    async def _sample_on(self, targets: list[str], requests: list[actor_pb2.GenerateRequest],
                         adapter: PublishedAdapter | None, stops, decode) -> list[SampledSequence]:
        """Each request on its actor, once the actors serve ``adapter``; a missing adapter is waited for once more
        (the actor restarted since it reported it), then refused."""
        for again in (False, True):
            if adapter is not None:
                await asyncio.gather(*(self._wait_served(actor, adapter.version, again) for actor in set(targets)))
            tasks = [asyncio.ensure_future(generate(self._stubs[actor], request, self._metadata, stops, decode))
                     for actor, request in zip(targets, requests, strict=True)]
            try:
                return list(await asyncio.gather(*tasks))
            except AdapterMissing as missing:
                if again:
                    raise RuntimeError(f"the actors do not serve the sampler weights {adapter.path} (they refused "
                                       f"them? see their logs): {missing}") from None
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ the published set

    async def _acquire(self, path: str) -> PublishedAdapter:
        """``path``'s adapter, published (with room made for it), marked in use."""
        async with self._changed:
            if self._set is None:
                self._set = AdapterSet(await self._capacity())
            await self._changed.wait_for(lambda: not self._retired(path))
            adapter = self._set.get(path)
            if adapter is not None:
                self._set.use(adapter)
                return adapter
        info, tensors = await asyncio.to_thread(self.training.sampler_weights, path)
        state = adapter_version_of(tensors)
        async with self._changed:
            await self._changed.wait_for(lambda: not self._retired(path) and (path in self._set
                                                                              or self._set.can_add()))
            adapter = self._set.get(path)
            if adapter is None:
                adapter, evicted = self._set.add(path, state, self._clock.next(), info)
                try:
                    await asyncio.to_thread(self._publisher.publish, adapter.version, self._set.bundle())
                except (TypeError, ValueError, RuntimeError) as exc:
                    self._set.put_back(adapter, evicted)
                    raise RuntimeError(f"the sampler weights {path} could not be published: {exc}") from exc
                log.info("published sampler weights %s as adapter %s (version %d)%s", path, adapter.name,
                         adapter.version, f", evicting {evicted.path}" if evicted is not None else "")
            self._set.use(adapter)
            return adapter

    def _retired(self, path: str) -> bool:
        adapter = self._set.get(path)
        return adapter is not None and adapter.retired

    async def _release(self, adapter: PublishedAdapter) -> None:
        async with self._changed:
            self._set.release(adapter)
            if adapter.retired and adapter.in_use == 0:
                await self._drop(adapter)
            self._changed.notify_all()

    async def forget(self, sampler_path: str) -> bool:
        """Stop serving ``sampler_path``'s adapter (its checkpoint was deleted or replaced): at once when no sample
        uses it, else when the last one using it ends; a sample asked for after this reads the path again (the new
        weights, or NotFound). False when it was not published."""
        self._bind_loop()
        async with self._changed:
            adapter = None if self._set is None else self._set.get(sampler_path)
            if adapter is None:
                return False
            adapter.retired = True
            if adapter.in_use == 0:
                await self._drop(adapter)
            self._changed.notify_all()
            return True

    async def _drop(self, adapter: PublishedAdapter) -> None:
        """Take ``adapter`` out of the set and publish the set without it (under the set's lock)."""
        self._set.remove(adapter.path)
        try:
            await asyncio.to_thread(self._publisher.publish, self._clock.next(), self._set.bundle())
        except (TypeError, ValueError, RuntimeError) as exc:      # the next bundle published leaves it out too
            log.warning("the adapter set without %s could not be published: %s", adapter.path, exc)
            return
        log.info("sampler weights %s are no longer served (adapter %s)", adapter.path, adapter.name)

    # ------------------------------------------------------------------ the actors

    async def _gauges(self, actor: str) -> dict[str, float]:
        try:
            report = await self._stubs[actor].Stats(common_pb2.StatsRequest(), metadata=self._metadata,
                                                    timeout=STATS_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise RuntimeError(f"actor {actor} did not answer Stats: {exc.details() or exc.code().name}") from None
        if "adapter_source_version" not in report.gauges:
            raise RuntimeError(f"actor {actor} follows no adapter source: start it with --adapter-source "
                               f"{self.fetch_endpoint},{self.announce_endpoint}")
        return dict(report.gauges)

    async def _capacity(self) -> int:
        """The most adapters every actor serves from its source (and ``max_adapters``)."""
        figures = await asyncio.gather(*(self._gauges(actor) for actor in self.actors))
        capacity = min(int(gauges["adapter_source_capacity"]) for gauges in figures)
        return capacity if self.max_adapters is None else min(capacity, self.max_adapters)

    async def _wait_served(self, actor: str, version: int, again: bool = False) -> None:
        """Until ``actor`` has applied source version ``version`` (or a later one); ``again``: ask even when it said
        so before."""
        if not again and self._applied.get(actor, -1) >= version:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        while True:
            applied = int((await self._gauges(actor))["adapter_source_version"])
            self._applied[actor] = applied
            if applied >= version:
                return
            if loop.time() > deadline:
                raise RuntimeError(f"actor {actor} has not applied adapter source version {version} within "
                                   f"{self.ready_timeout_s:.0f} s (it is at {applied}): does it follow "
                                   f"{self.fetch_endpoint}?")
            await asyncio.sleep(self.poll_s)

    async def _tokenizer(self, reference: str):
        if reference not in self._tokenizers:
            from forge.checkpoints import load_tokenizer

            self._tokenizers[reference] = await asyncio.to_thread(load_tokenizer, reference)
        return self._tokenizers[reference]

    def _bind_loop(self) -> None:
        """Channels and the set's condition for the running event loop (made again for another loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        self._channels = [grpc.aio.insecure_channel(actor, options=CHANNEL_OPTIONS) for actor in self.actors]
        self._stubs = {actor: actor_pb2_grpc.ActorStub(channel) for actor, channel in zip(self.actors, self._channels,
                                                                                          strict=True)}
        self._changed = asyncio.Condition()

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels, self._stubs, self._loop = [], {}, None
        self._publisher.close()


__all__ = ["ActorSampling", "adapter_version_of"]
