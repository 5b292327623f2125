"""The vLLM backend: vLLM's ``AsyncLLM`` (its engine core in a process of its own) behind the ``Backend``
interface, so that ``forge-actor --backend vllm`` serves the same Actor service as the embedded torch engine.

Generation maps one-to-one: token ids in (``TokensPrompt``), token ids out (``detokenize=False``), streamed as
deltas, each with the log-probability it was sampled under and the weight version that produced it. End of sequence
is given to vLLM as stop token ids, so it stops exactly where the torch engine does. The log-probabilities,
structured output and the engine's figures: ``forge.actors.vllm.outputs``.

Weight versions load between steps, never during one: the scheduler is paused (``pause_generation``, requests in
flight kept or aborted per ``on_weight_swap``, the prefix cache and running requests' KV cleared, so that KV of an
old version is never reused), the outputs of the old version's last step are drained to their streams, the
tensors are reloaded in place (vLLM's ``reload_weights`` from a safetensors file in a private directory, through
``forge.actors.vllm.worker``: a path crosses vLLM's worker RPC, tensors do not on its CPU build), and the scheduler
resumes. Tensors vLLM does not know (the MTP head, ``mtp.*``) are left out of what it loads; the learner keeps
training them.

Named adapters (several runs on one actor, ``--adapter``) are vLLM's own LoRA adapters, two slots per run (a run's
new version loads while requests of its previous one finish); each version is written as a PEFT directory and added
under an id of its own, and a request naming the adapter is sampled with its newest version, which stamps all its
tokens. The base weights do not change under them (such an actor follows no weight stream of its own).

vLLM is imported lazily, so everything else works without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from forge import variables
from forge.actors.backend import (
    Backend,
    FinishReason,
    GenerationRequest,
    InvalidRequest,
    Ledger,
    RequestStream,
    TokenChunk,
    check_weights,
)
from forge.actors.config import VLLM_INSTALL_HINT, EngineConfig
from forge.actors.kinds import VLLM
from forge.actors.limits import RequestLimits
from forge.actors.vllm import checkpoint, outputs, scoring
from forge.checkpoints import ModelRef
from forge.model.lora_weights import adapter_rank, check_named_adapter_version, write_peft_directory
from forge.reaper import Reaper

log = logging.getLogger(__name__)


class VllmBackend(Backend):
    """vLLM serving one checkpoint. Thread-safe: submit, abort and load_weights may come from any thread; the
    work happens on the backend's own event loop."""

    kind = VLLM

    def __init__(self, ref: ModelRef, config: EngineConfig, *, dtype: str = "float32", device: str = "cpu",
                 initial_version: int = 0, kv_events: bool = True, start_timeout_s: float = 900.0,
                 adapters: int = 0) -> None:
        """``kv_events``: follow vLLM's KV event stream for routers (``kv_events()``); ``adapters``: the named
        adapters it serves (vLLM's LoRA is enabled with room for them)."""
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(VLLM_INSTALL_HINT) from exc
        self.config = config
        self.model_id = ref.model_id
        self._dir = Path(tempfile.mkdtemp(prefix="forge-vllm-", dir=checkpoint.fast_tmp()))    # mode 0700
        model_config = checkpoint.served_model(ref.directory)
        # vLLM returns routed experts from its GPU model runner only; elsewhere the record carries none
        self.routing = (model_config.sparse_layers, model_config.num_experts) if (
            model_config.is_moe and device.startswith("cuda")) else None
        self.served_dir, self.weight_shapes = checkpoint.serving_checkpoint(ref.directory, self._dir / "checkpoint")
        # structured output needs vLLM's tokenizer: loaded only where its grammars mask as ours do
        self.structured_problem = checkpoint.structured_output_problem(self.served_dir, model_config.vocab_size,
                                                            tuple(model_config.eos_token_ids))
        if self.structured_problem is not None:
            log.info("vLLM runs without a tokenizer; structured output is refused: %s", self.structured_problem)
        self._version = initial_version
        self._dtype = dtype
        self._adapter_slots = adapters
        self._loras: dict[str, Any] = {}            # named adapter -> the LoRARequest of its newest version
        self._adapter_ids = 0
        self._request_adapters: dict[str, str] = {}
        self._retired: dict[str, Any] = {}          # named adapter -> its version before the newest, still held
        self._figures = outputs.Figures()
        self._counters = {"weight_swaps": 0, "finished": 0, "aborted_by_swap": 0}
        self._last_swap_ms = 0.0
        self._lock = threading.Lock()
        self._swap_lock = threading.Lock()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        events_endpoint = f"ipc://{self._dir}/kv-events" if kv_events and config.prefix_caching else None
        max_len = min(model_config.max_position_embeddings, checkpoint.kv_token_capacity(model_config, dtype, config))
        if max_len < model_config.max_position_embeddings:
            log.info("the KV cache (%d MiB) holds %d tokens: requests are limited to that, not to the model's %d",
                     config.kv_cache_bytes >> 20, max_len, model_config.max_position_embeddings)
        engine_args = self._engine_args(dtype, device, events_endpoint, max_len)
        log.info("starting vLLM on %s (%s, %s; its first start compiles: 30 s to a few minutes)", self.served_dir,
                 device, dtype)
        # vLLM's engine core and workers outlive a kill -9 of this process (holding their memory, on a GPU the
        # device's): the reaper ends them then.
        self._reaper = Reaper()
        self._reaper.adopt()
        try:
            self.llm = self._call(self._start(engine_args), timeout=start_timeout_s)
        except BaseException:
            self._reaper.close()
            self._stop_loop()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._reaper.settle()
        cache = self.llm.vllm_config.cache_config
        self.block_size = int(cache.block_size)
        self.num_blocks = int(cache.num_gpu_blocks or 0)
        self.limits = RequestLimits(model_config.vocab_size, max_len, self.num_blocks * self.block_size or max_len,
                                    tuple(model_config.eos_token_ids), config.max_waiting + config.max_num_seqs)
        # versions accepted (guarded by _swap_lock), adapters added and live streams (by _lock)
        self.ledger = Ledger(initial_version, self.limits.max_in_flight)
        self.events = None
        if events_endpoint is not None:
            from forge.actors.vllm.kv_events import VllmKVEvents

            self.events = VllmKVEvents(events_endpoint, self.model_id, lambda: self._version)
        log.info("vLLM serving %s: %d KV blocks of %d tokens", self.model_id, self.num_blocks, self.block_size)

    def _engine_args(self, dtype: str, device: str, kv_events_endpoint: str | None, max_len: int) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        config = self.config
        kwargs: dict[str, Any] = dict(
            model=str(self.served_dir), skip_tokenizer_init=self.structured_problem is not None, dtype=dtype,
            seed=config.seed, max_model_len=max_len, block_size=checkpoint.block_size_on(device, config.block_size),
            kv_cache_memory_bytes=config.kv_cache_bytes,
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            enable_prefix_caching=config.prefix_caching, logprobs_mode="processed_logprobs",
            enforce_eager=not config.compile_decode, disable_log_stats=True,
            worker_extension_cls="forge.actors.vllm.worker.ForgeWorkerExtension")
        if self._adapter_slots:
            kwargs.update(enable_lora=True, max_loras=2 * self._adapter_slots, max_cpu_loras=2 * self._adapter_slots,
                          max_lora_rank=config.max_adapter_rank)
        if self.structured_problem is None:
            from vllm.config import StructuredOutputsConfig

            # llguidance, the engine forge.sampling.grammar compiles with (the JSON layout travels in the grammar)
            kwargs["structured_outputs_config"] = StructuredOutputsConfig(backend="guidance")
        if kv_events_endpoint is not None:
            from vllm.config import KVEventsConfig

            kwargs["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                                        endpoint=kv_events_endpoint, topic="kv")
        if device.startswith("cuda"):
            kwargs["gpu_memory_utilization"] = 0.9
            if self.routing is not None:
                kwargs["enable_return_routed_experts"] = True
        elif config.threads:
            # vLLM's CPU workers read their thread count from OpenMP's variable; binding them to cores would fight
            # the other services of a machine, so they float as torch's own threads do.
            if not variables.is_set("VLLM_CPU_OMP_THREADS_BIND"):
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            os.environ["OMP_NUM_THREADS"] = str(config.threads)
        return AsyncEngineArgs(**kwargs)

    async def _start(self, engine_args: Any) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(engine_args, stat_loggers=[outputs.stat_logger_class(self._figures)])

    # ------------------------------------------------------------------ interface

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def failed(self) -> bool:
        return not self._closed and self.llm is not None and bool(self.llm.errored)

    def submit(self, request: GenerationRequest) -> RequestStream:
        max_tokens, stops = self.limits.check(request)
        grammar = request.params.grammar
        if grammar is not None:
            if self.structured_problem is not None:
                raise InvalidRequest(f"this vLLM actor serves no structured output: {self.structured_problem}")
            problem = grammar.problem()          # in the sandbox first, when served (ActorServicer)
            if problem is not None:
                raise InvalidRequest(problem)
        request_id = request.request_id or uuid.uuid4().hex
        stream = RequestStream(request_id)
        with self._lock:
            self.ledger.check_adapter_named(request)
            adapter = (self.ledger.adapters[request.adapter], self._loras[request.adapter]) if request.adapter \
                else None
            self.ledger.admit(request_id, stream, self._refusal())
            if adapter is not None:
                self._request_adapters[request_id] = request.adapter
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        if request.score_from:
            request = replace(request, request_id=request_id)
            version = adapter[0] if adapter is not None else self._version
            work = scoring.score(self.llm, request, scoring.score_params(), stream, adapter[1] if adapter is not None else None, version)
            asyncio.run_coroutine_threadsafe(self._served(request_id, stream, work), self._loop)
            return stream
        try:
            params = VllmSamplingParams(output_kind=RequestOutputKind.DELTA,
                                        **outputs.sampling_kwargs(request.params, max_tokens, stops))
        except ValueError as exc:
            with self._lock:
                self.ledger.live.pop(request_id, None)
                self._request_adapters.pop(request_id, None)
            raise InvalidRequest(str(exc)) from exc
        request = replace(request, request_id=request_id)
        asyncio.run_coroutine_threadsafe(self._served(request_id, stream, self._generate(request, params, stream,
                                                                                          adapter)), self._loop)
        return stream

    async def _generate(self, request: GenerationRequest, params: Any, stream: RequestStream,
                        adapter: tuple[int, Any] | None = None) -> None:
        """``adapter``: the named adapter's version and its ``LoRARequest``, which sample every token."""
        from vllm.inputs import TokensPrompt

        request_id, every = request.request_id, request.stream_interval
        started = time.perf_counter()
        first: float | None = None
        held = TokenChunk()              # tokens kept back to send ``every`` at a time (the first goes at once)
        generated = 0
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        lora = adapter[1] if adapter is not None else None
        async for output in self.llm.generate(prompt, params, request_id, lora_request=lora):
            completion = output.outputs[0]
            generated += len(completion.token_ids)          # outputs are deltas
            version = adapter[0] if adapter is not None else self._version
            chunk = outputs.chunk_of(completion, version, request.params.top_logprobs)
            if first is None:
                first = time.perf_counter()
                if every > 1 and len(chunk.token_ids) > 1:     # vLLM merged steps: the first token goes alone
                    head, chunk = outputs.split_first(chunk)
                    head.cached_prompt_tokens = int(output.num_cached_tokens or 0)
                    stream.put(head)
                    if len(chunk.token_ids) < every and not output.finished:
                        held = chunk
                        continue
                else:
                    chunk.cached_prompt_tokens = int(output.num_cached_tokens or 0)
            elif every > 1:
                chunk = outputs.joined(held, chunk)
                if len(chunk.token_ids) < every and not output.finished:
                    held = chunk
                    continue
                held = TokenChunk()
            if output.finished:
                chunk.finish_reason = outputs.VLLM_FINISH.get(str(completion.finish_reason), FinishReason.STOP)
                outputs.chunk_timing(chunk, output.metrics, started, first)
                rows = getattr(completion, "routed_experts", None)
                if self.routing is not None and rows is not None:
                    fed = len(request.prompt_ids) + generated - 1
                    chunk.routed_experts = outputs.routing_of_rows(rows, fed, *self.routing)
            stream.put(chunk)

    async def _served(self, request_id: str, stream: RequestStream, work: Any) -> None:
        """Run a request's coroutine ``work``: a failure ends its stream with the error; either way it leaves the
        ledger."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("vLLM request %s failed", request_id)
            stream.put(TokenChunk(finish_reason=FinishReason.ERROR, error=f"vLLM failed: {exc}"))
        finally:
            self._ended(request_id, stream)

    def _ended(self, request_id: str, stream: RequestStream) -> None:
        """A request's end, however it came: out of the ledger, counted, its stream closed."""
        with self._lock:
            self.ledger.live.pop(request_id, None)
            self._request_adapters.pop(request_id, None)
            self._counters["finished"] += 1
        if not stream.finished.is_set():
            stream.put(TokenChunk(finish_reason=FinishReason.ABORT))

    def _refusal(self) -> str:
        if self._closed:
            return "the backend is shutting down"
        return "vLLM's engine is not running (see the log)" if self.failed else ""

    def abort(self, request_id: str) -> bool:
        if request_id not in self.ledger.live:
            return False
        asyncio.run_coroutine_threadsafe(self.llm.abort(request_id), self._loop)
        return True

    def load_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Apply a verified version between steps; returns once later tokens carry it. Tensors vLLM does not serve
        (``mtp.*``) are checked for nothing here and left out; a model with experts is written in the per-expert
        layout of its checkpoint, which is what vLLM loads. A LoRA adapter version is merged onto the checkpoint vLLM
        started from (``forge.model.lora_weights``), then loaded like any other."""
        from safetensors.torch import save_file

        from forge.model.checkpoint import hub_layout

        state_dict = self.ledger.whole_weights(state_dict, self._checkpoint_weights, "the checkpoint's weights",
                                               checkpoint.vllm_tensors)
        served = checkpoint.vllm_tensors(hub_layout(dict(state_dict)))
        check_weights(version, served, self.weight_shapes)
        with self._swap_lock:
            self.ledger.accept_version(version)
            staged = self._dir / f"version-{version}"
            staged.mkdir()
            try:
                save_file({name: t.detach().to("cpu").contiguous() for name, t in served.items()},
                          staged / "model.safetensors")
                self._call(self._swap(version, staged), timeout=600.0)
            finally:
                shutil.rmtree(staged, ignore_errors=True)

    @property
    def adapter_versions(self) -> dict[str, int]:
        return dict(self.ledger.adapters)

    def load_adapter(self, name: str, version: int, adapter_version: Mapping[str, torch.Tensor]) -> None:
        """Add version ``version`` of the named adapter to vLLM (a PEFT directory of its own, under a new LoRA id);
        requests naming it take it from then on, and the version two before is dropped."""
        from vllm.lora.request import LoRARequest

        if not self._adapter_slots:
            raise ValueError("this vLLM actor was started without named adapters (--adapter)")
        check_named_adapter_version(name, version, adapter_version)
        rank = adapter_rank(adapter_version)
        if rank > self.config.max_adapter_rank:
            raise ValueError(f"adapter {name!r} has rank {rank}; this actor serves ranks up to "
                             f"{self.config.max_adapter_rank} (--max-adapter-rank)")
        with self._swap_lock:
            current = self._loras.get(name)
            if current is None and len(self._loras) >= self._adapter_slots:
                raise ValueError(f"this actor serves {self._adapter_slots} named adapters; {name!r} is not one")
            self.ledger.check_adapter_version(name, version)
            self._adapter_ids += 1
            directory = write_peft_directory(checkpoint.vllm_tensors(adapter_version),
                                             self._dir / "adapters" / f"{name}-{version}")
            request = LoRARequest(f"{name}@{version}", self._adapter_ids, str(directory))
            try:
                self._call(self.llm.add_lora(request), timeout=600.0)
            except Exception as exc:
                shutil.rmtree(directory, ignore_errors=True)
                raise ValueError(f"vLLM refused version {version} of adapter {name!r}: {exc}") from exc
            with self._lock:
                self.ledger.accept_adapter(name, version)
                self._loras[name] = request
                in_flight = [r for r, n in self._request_adapters.items() if n == name]
            self._drop_adapter_before(name, current)
        self._counters["weight_swaps"] += 1
        if self.config.abort_on_weight_swap:
            for request_id in in_flight:
                self.abort(request_id)
            self._counters["aborted_by_swap"] += len(in_flight)
        log.info("serving version %d of adapter %s (LoRA id %d, rank %d)", version, name, self._adapter_ids, rank)

    def _drop_adapter_before(self, name: str, current: Any) -> None:
        """Drop the version of ``name`` before ``current`` (its slot goes to the next version; ``current`` keeps
        serving the requests that took it)."""
        retired = self._retired
        older = retired.pop(name, None)
        if current is not None:
            retired[name] = current
        if older is not None:
            with contextlib.suppress(Exception):
                self._call(self.llm.remove_lora(older.lora_int_id), timeout=60.0)
            shutil.rmtree(older.lora_path, ignore_errors=True)

    def _checkpoint_weights(self) -> dict[str, torch.Tensor]:
        """The served checkpoint's tensors, in the served dtype: the base adapter versions merge onto."""
        from forge.model.checkpoint import load_state_dict

        return checkpoint.vllm_tensors(load_state_dict(self.served_dir, dtype=getattr(torch, self._dtype)))

    async def _swap(self, version: int, staged: Path) -> None:
        paused = time.perf_counter()
        mode = "abort" if self.config.abort_on_weight_swap else "keep"
        in_flight = len(self.ledger.live)
        await self.llm.pause_generation(mode=mode, clear_cache=True)
        try:
            await self._drain_outputs()
            await self.llm.collective_rpc("forge_load_weights", args=(str(staged),))
            self._version = version
            if self.events is not None:
                self.events.forget_all(version)
        finally:
            await self.llm.resume_generation()
        self._last_swap_ms = (time.perf_counter() - paused) * 1e3
        self._counters["weight_swaps"] += 1
        if mode == "abort":
            self._counters["aborted_by_swap"] += in_flight
        log.info("applied weight version %d in %.1f ms (generation paused meanwhile)", version, self._last_swap_ms)

    async def _drain_outputs(self) -> None:
        """Wait until every output of the steps before the pause has reached its stream, so that none of them is
        stamped with the new version. vLLM hands outputs to per-request collectors before a pause completes; the
        requests' tasks take them from there on this loop."""
        states = self.llm.output_processor.request_states
        for _ in range(10_000):
            pending = [s for s in list(states.values()) if getattr(getattr(s, "queue", None), "output", None)]
            if not pending:
                return
            await asyncio.sleep(0)
        log.warning("outputs of %d requests were still pending when the weights were swapped", len(pending))

    def stats(self) -> dict[str, float]:
        f = self._figures
        with self._lock:
            in_flight = len(self.ledger.live)
        # vLLM's figures are as of its last step; the requests in flight are known now (none: no KV in use).
        running = min(f.running, in_flight)
        return {
            "tokens_per_s": f.tokens_per_s(),
            "running": float(running),
            "waiting": float(in_flight - running),
            "kv_used_frac": f.kv_used_frac if in_flight else 0.0,
            "kv_blocks": float(self.num_blocks),
            "prefix_hit_rate": f.prefix_hits / f.prefix_queries if f.prefix_queries else 0.0,
            "weight_version": float(self._version),
            "adapters": float(len(self._loras)),
            "preemptions": float(f.preemptions),
            "tokens": float(f.tokens),
            "weight_swap_ms": self._last_swap_ms,
            "threads": float(self.config.threads or os.cpu_count() or 1),
            "kv_events": float(self.events is not None),
            **{k: float(v) for k, v in self._counters.items()},
            "refused": float(self.ledger.refused),
            **({k: float(v) for k, v in self.events.counters.items()} if self.events is not None else {}),
        }

    def kv_events(self) -> tuple[Any, Any] | None:
        """The KV event log and its describer, for a ``KVEventSourceServicer``; None without KV events (the
        router then routes this actor by load alone)."""
        if self.events is None:
            return None
        return self.events.log, self._describe_kv

    def _describe_kv(self) -> tuple[Any, dict[str, float]]:
        stats = self.stats()
        keep = ("running", "waiting", "kv_used_frac", "tokens_per_s")
        layout = self.events.layout(self.block_size, self.num_blocks, self.config.max_num_seqs)
        return layout, {k: stats[k] for k in keep}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self.ledger.live)
        for request_id in live:
            self.abort(request_id)
        with contextlib.suppress(Exception):
            self._call(self._shutdown(), timeout=120.0)
        if self.events is not None:
            self.events.close()
        self._reaper.close()
        self._stop_loop()
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _shutdown(self) -> None:
        llm, self.llm = self.llm, None          # vLLM's __del__ shuts down again: let it run now, not at exit
        llm.shutdown()
        del llm

    # ------------------------------------------------------------------ plumbing

    def _call(self, coroutine: Any, timeout: float) -> Any:
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=timeout)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

