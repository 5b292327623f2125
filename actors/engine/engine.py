"""The embedded torch engine: a background loop that admits requests, runs model steps over the paged KV cache,
streams sampled tokens to their requests, and swaps weight versions between steps (never during one)."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from forge.actors.backend import (
    Backend,
    FinishReason,
    InvalidRequest,
    Ledger,
    RequestStream,
    RoutedExperts,
    TokenChunk,
    batched_wakeups,
    check_weights,
)
from forge.actors.config import EngineConfig
from forge.actors.engine.adapters import AdapterWeights, ServedAdapters
from forge.actors.engine.block_manager import BlockManager
from forge.actors.engine.paged_attention import PagedKVCache
from forge.actors.engine.runner import ModelRunner, PreparedWeights, Sampled, Work
from forge.actors.engine.scheduler import Scheduler, SchedulerConfig
from forge.actors.engine.sequence import Sequence, Status
from forge.actors.kinds import TORCH
from forge.actors.limits import RequestLimits
from forge.kvhash import kv_salt
from forge.model.qwen3 import CausalLM
from forge.sampling.grammar import Grammars
from forge.sampling.logit_edits import call_edits

if TYPE_CHECKING:
    from forge.actors.backend import GenerationRequest
    from forge.actors.engine.connector import EngineConnector

log = logging.getLogger(__name__)

MESSAGES_PER_STEP = 4          # adaptive streaming's target (EngineConfig.stream_interval = 0)


class TorchEngine(Backend):
    kind = TORCH

    def __init__(self, model: CausalLM, config: EngineConfig | None = None, initial_version: int = 0,
                 grammars: Grammars | None = None) -> None:
        """``grammars`` compile structured-output requests (None: such requests are refused)."""
        self.config = config = config or EngineConfig()
        self.grammars = grammars
        self.model = model.eval()
        self.model.requires_grad_(False)
        mc = model.config
        self.device = model.output_weight.device
        self.speculative = config.speculative and mc.num_nextn_predict_layers > 0
        layers = mc.num_hidden_layers + (1 if self.speculative else 0)
        dtype = model.output_weight.dtype
        # A model with experts keeps its routing per slot, for the learner's routing replay.
        routing = (len(mc.sparse_layers), mc.num_experts_per_tok) if mc.sparse_layers else None
        per_block = PagedKVCache.bytes_per_block(layers, config.block_size, mc.num_key_value_heads, mc.head_dim, dtype,
                                                 routing)
        num_blocks = config.kv_cache_bytes // per_block
        if config.stream_interval < 0:
            raise ValueError(f"stream_interval must be 0 (adaptive) or more, got {config.stream_interval}")
        if num_blocks < 2:
            raise ValueError(f"kv_cache_bytes={config.kv_cache_bytes} holds fewer than 2 blocks of {per_block} bytes")
        self.cache = PagedKVCache(layers, num_blocks, config.block_size, mc.num_key_value_heads, mc.head_dim, dtype,
                                  self.device, routing)
        self.blocks = BlockManager(num_blocks, config.block_size, prefix_caching=config.prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens,
                                                   speculative=self.speculative,
                                                   prefill_share=config.prefill_share), self.blocks)
        self.runner = ModelRunner(model, self.cache, self.speculative, config.cpu_kernels, config.compile_decode,
                                  config.packed_linear)
        self._threads = config.threads or torch.get_num_threads()
        self._loop_threads = 0                      # what the loop thread runs with, once it has started
        self._seeds = random.Random(config.seed)     # seeds of requests that bring none
        self._version = initial_version
        self._variant = "mtp" if self.speculative else ""
        self._lock = threading.Condition()
        self._inbox: deque[Sequence] = deque()
        self._aborts: set[str] = set()
        self._pending_weights: tuple[int, Mapping[str, torch.Tensor], PreparedWeights] | None = None
        self.adapters = ServedAdapters(model)                 # named adapters, beside the weights (several runs)
        self.runner.head_adapters = self.adapters.head_delta
        self._pending_adapters: list[AdapterWeights | str] = []     # versions to install, names to drop, in order
        self._closed = False
        self._started = time.time()
        self._counters = dict(steps=0, tokens=0, prompt_tokens=0, scored_tokens=0, finished=0, drafts=0,
                              drafts_accepted=0, weight_swaps=0, weight_rejections=0)
        self._recent: deque[tuple[float, int]] = deque()
        self.connector: EngineConnector | None = None   # KV events, speeds, L3 cache (l3.py attaches itself)
        self.stream_factory: Callable[[str], RequestStream] = RequestStream   # where a request's chunks go
        self.after_pass: Callable[[], None] | None = None    # run by the loop after each pass (the engine core's send)
        self._limits = self.limits()
        # versions handed over (applied or about to be), adapters staged, live sequences (guarded by _lock)
        self.ledger = Ledger(initial_version, self._limits.max_in_flight)
        self._thread = threading.Thread(target=self._loop, name=f"{config.name}-engine", daemon=True)
        self._thread.start()
        log.info("torch engine ready: %d KV blocks of %d tokens (%.1f MiB), speculative=%s, device=%s, "
                 "decode attention=%s, linear=%s", num_blocks, config.block_size, num_blocks * per_block / 2**20,
                 self.speculative, self.device, "compiled C kernel" if self.runner.kernel else "torch",
                 "oneDNN packed" if self.runner.packs else "F.linear")

    # ------------------------------------------------------------------ interface

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def variant(self) -> str:
        return self._variant

    def salt(self, version: int | None = None) -> bytes:
        return kv_salt(self.config.model_id, self._version if version is None else version, self._variant)

    @property
    def adapter_versions(self) -> dict[str, int]:
        return self.adapters.versions

    def version_of(self, seq: Sequence) -> int:
        """The weight version ``seq`` is sampled with: its adapter's, or the engine's own."""
        return self.adapters.version(seq.adapter) if seq.adapter else self._version

    def salt_of(self, seq: Sequence, version: int | None = None) -> bytes:
        """What ``seq``'s KV blocks are hashed with: the model's salt, with its adapter's name and version when it
        names one (an adapter's KV is its own)."""
        if not seq.adapter:
            return self.salt(version)
        version = self.adapters.version(seq.adapter) if version is None else version
        return kv_salt(f"{self.config.model_id}+{seq.adapter}", version, self._variant)

    def wake(self) -> None:
        """Make the loop look at its inputs again (the L3 connector has requests ready)."""
        with self._lock:
            self._lock.notify()

    def submit(self, request: GenerationRequest) -> RequestStream:
        seq = self._validate(request)
        with self._lock:
            self.ledger.admit(seq.request_id, seq, "the engine is shutting down" if self._closed else "")
            self._inbox.append(seq)
            self._lock.notify()
        return seq.stream

    def abort(self, request_id: str) -> bool:
        with self._lock:
            if request_id not in self.ledger.live:
                return False
            self._aborts.add(request_id)
            self._lock.notify()
        return True

    def load_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Stage a weight version: the whole model's tensors, or a LoRA adapter version, merged here onto the weights
        the engine started from (``forge.model.lora_weights``)."""
        try:
            state_dict = self.ledger.whole_weights(state_dict, self._host_copy, "the starting weights")
            check_weights(version, state_dict, {n: t.shape for n, t in self.model.state_dict().items()})
        except ValueError:
            self._counters["weight_rejections"] += 1
            raise
        prepared = self.runner.prepare_weights(state_dict)      # here, while the loop keeps stepping
        with self._lock:
            self.ledger.accept_version(version)     # the loop may have taken a newer one off the queue, not applied
            self._pending_weights = (version, state_dict, prepared)
            self._lock.notify()

    def load_adapter(self, name: str, version: int, adapter_version: Mapping[str, torch.Tensor]) -> None:
        """Stage version ``version`` of the named adapter ``name`` (``actors.engine.adapters``): its requests are
        sampled with it from the next step on."""
        if self.runner.compiled is not None:
            raise ValueError("named adapters are not served in graph mode (--compile-decode)")
        try:
            prepared = self.adapters.prepare(name, version, adapter_version)      # here, while the loop steps
        except ValueError:
            self._counters["weight_rejections"] += 1
            raise
        with self._lock:
            self.ledger.accept_adapter(name, version)
            self._pending_adapters.append(prepared)
            self._lock.notify()

    def unload_adapter(self, name: str) -> None:
        """Stop serving the named adapter from the next step on; its requests in flight end with an error."""
        with self._lock:
            self.ledger.drop_adapter(name)
            self._pending_adapters.append(name)
            self._lock.notify()

    def _host_copy(self) -> dict[str, torch.Tensor]:
        """The model's weights as they are now, copied to the host: the base adapter versions merge onto."""
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in self.model.state_dict().items()}

    def wait_for_version(self, version: int, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while self._version < version:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def stats(self) -> dict[str, float]:
        now = time.perf_counter()
        while self._recent and now - self._recent[0][0] > 10.0:
            self._recent.popleft()
        window = now - self._recent[0][0] if len(self._recent) > 1 else 0.0
        recent_tokens = self._recent[-1][1] - self._recent[0][1] if self._recent else 0
        c = self._counters
        return {
            "tokens_per_s": recent_tokens / window if window > 0 else 0.0,
            "running": float(len(self.scheduler.running)),
            "waiting": float(len(self.scheduler.waiting) + len(self._inbox)),
            "kv_used_frac": self.blocks.used_fraction,
            "kv_blocks": float(len(self.blocks.blocks)),
            "prefix_hit_rate": self.blocks.hit_tokens / self.blocks.lookup_tokens if self.blocks.lookup_tokens else 0.0,
            "spec_acceptance": c["drafts_accepted"] / c["drafts"] if c["drafts"] else 0.0,
            "weight_version": float(self._version),
            "adapters": float(len(self.adapters)),
            "preemptions": float(self.scheduler.preemptions),
            "threads": float(self._loop_threads),
            **{k: float(v) for k, v in c.items()},
            "refused": float(self.ledger.refused),
            **(self.connector.stats() if self.connector is not None else {}),
        }

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=30)
        for seq in list(self.ledger.live.values()):
            self._finish(seq, FinishReason.ABORT)
        if self.connector is not None:
            self.connector.close()

    # ------------------------------------------------------------------ validation

    def limits(self) -> RequestLimits:
        mc = self.model.config
        return RequestLimits(mc.vocab_size, mc.max_position_embeddings,
                             len(self.blocks.blocks) * self.config.block_size - 2, tuple(mc.eos_token_ids),
                             self.config.max_waiting + self.config.max_num_seqs)

    def _validate(self, request: GenerationRequest) -> Sequence:
        max_tokens, stops = self._limits.check(request)
        params = request.params
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(64)
        request_id = request.request_id or uuid.uuid4().hex
        prompt = list(request.prompt_ids)
        try:
            edits = None if request.score_from else call_edits(params, prompt, self._limits.eos_token_ids,
                                                                 self.grammars)
        except ValueError as exc:          # a grammar that does not compile, or no tokenizer to compile it
            raise InvalidRequest(str(exc)) from None
        self.ledger.check_adapter_named(request)      # accepted: installed before it is stepped
        if request.adapter and (request.prefill_only or request.continuation is not None):
            raise InvalidRequest("a request naming an adapter is served whole, not handed over between actors")
        if request.prefill_only and (self.connector is None or not self.connector.hands_over):
            raise InvalidRequest("prefill_only needs an L3 cache to hand the prompt's KV blocks over (--l3-cache)")
        return Sequence.of(request, request_id, self.stream_factory(request_id), max_tokens, stops, seed, edits)

    # ------------------------------------------------------------------ loop

    def _loop(self) -> None:
        torch.set_num_threads(self._threads)     # per thread for OpenMP: the loop runs the model, nothing else
        self._loop_threads = torch.get_num_threads()
        while True:
            with self._lock:
                while not (self._closed or self._inbox or self._aborts or self._pending_weights or self._pending_adapters
                           or self.scheduler.has_work or (self.connector is not None and self.connector.has_ready())):
                    self._lock.wait()
                if self._closed:
                    return
                incoming, self._inbox = self._inbox, deque()
                aborts, self._aborts = self._aborts, set()
                weights, self._pending_weights = self._pending_weights, None
                adapters, self._pending_adapters = self._pending_adapters, []
            connector = self.connector
            for seq in incoming:
                if self._stale_handover(seq) or self._dropped_adapter(seq):
                    continue
                if connector is None or not connector.intercept(seq):   # L3: held while its blocks are fetched
                    self.scheduler.add(seq)
            if connector is not None:
                for seq in connector.take_ready():
                    if not (self._stale_handover(seq) or self._dropped_adapter(seq)):
                        self.scheduler.add(seq)
            for request_id in aborts:
                seq = self.ledger.live.get(request_id)
                if seq is not None:
                    self._finish(seq, FinishReason.ABORT)
            if weights is not None:
                self._apply_weights(*weights)
            for adapter in adapters:
                if isinstance(adapter, str):
                    self._drop_adapter(adapter)
                else:
                    self._apply_adapter(adapter)
            if self.scheduler.has_work:
                try:
                    with batched_wakeups():         # the step's chunks wake an asyncio server once
                        self._step()
                except Exception as exc:  # a failed step must not kill the engine: fail its requests instead
                    log.exception("engine step failed")
                    for seq in [*self.scheduler.running]:
                        self._finish(seq, FinishReason.ERROR, error=f"engine step failed: {exc}")
            if self.after_pass is not None:
                self.after_pass()

    def _apply_weights(self, version: int, state_dict: Mapping[str, torch.Tensor], prepared: PreparedWeights
                       ) -> None:
        started = time.perf_counter()
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                tensor.copy_(state_dict[name])
        self.runner.weights_changed(prepared)
        self._version = version
        self._counters["weight_swaps"] += 1
        if self.config.abort_on_weight_swap:
            for seq in list(self.scheduler.running):
                self._finish(seq, FinishReason.ABORT, error="aborted by a weight swap")
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            if (seq.prefill_only and seq.num_computed) or (seq.handover_version is not None and seq.first_token is None):
                self._finish(seq, FinishReason.ERROR, retryable=True,
                             error=f"the weights changed to version {version} during a handover; send it again")
        for seq in self.scheduler.running:
            seq.draft = None        # drafted by the old weights' MTP head
        log.info("applied weight version %d in %.1f ms", version, (time.perf_counter() - started) * 1e3)

    def _apply_adapter(self, adapter: AdapterWeights) -> None:
        self.adapters.install(adapter)
        self._counters["weight_swaps"] += 1
        if self.config.abort_on_weight_swap:
            for seq in [s for s in self.scheduler.running if s.adapter == adapter.name]:
                self._finish(seq, FinishReason.ABORT, error="aborted by a weight swap")
        log.info("serving version %d of adapter %s (%d modules, %.2f MiB)", adapter.version, adapter.name,
                 len(adapter.pairs), adapter.nbytes / 2**20)

    def _drop_adapter(self, name: str) -> None:
        for seq in [s for s in (*self.scheduler.running, *self.scheduler.waiting) if s.adapter == name]:
            self._finish(seq, FinishReason.ERROR, error=f"adapter {name!r} is no longer served here")
        if name in self.adapters:
            self.adapters.remove(name)
        log.info("dropped adapter %s", name)

    def _dropped_adapter(self, seq: Sequence) -> bool:
        """Refuse a request whose adapter was dropped after the request was checked."""
        if not seq.adapter or seq.adapter in self.ledger.adapters:
            return False
        self._finish(seq, FinishReason.ERROR, error=f"adapter {seq.adapter!r} is no longer served here")
        return True

    def _step(self) -> None:
        admitted_before = set(map(id, self.scheduler.running))
        work = self.scheduler.schedule(self.salt_of)
        if not work:
            if self.scheduler.waiting and not self.scheduler.running:
                seq = self.scheduler.waiting[0]   # cannot fit even alone (should have been refused at submit)
                self._finish(seq, FinishReason.ERROR, error="the request does not fit in the KV cache")
            return
        now = time.perf_counter()
        for item in work:
            if id(item.seq) not in admitted_before:
                item.seq.kv_version = self.version_of(item.seq)
                if item.seq.admitted is None:
                    item.seq.admitted = now
                    self._counters["prompt_tokens"] += item.seq.num_prompt
        drafts = [item.draft is not None for item in work]
        started = time.perf_counter()
        with self.adapters.rows([item.seq.adapter for item in work]):
            results = self.runner.run(work)
        elapsed = time.perf_counter() - started
        self.scheduler.ran(elapsed)
        self._counters["steps"] += 1
        interval = self._stream_interval()
        for item, result, drafted in zip(work, results, drafts, strict=True):
            if drafted and result is not None:
                self._counters["drafts"] += 1
                self._counters["drafts_accepted"] += int(bool(result.draft_accepted))
            self.blocks.register_full_blocks(item.seq, self.salt_of(item.seq, item.seq.kv_version))
            if item.seq.failure is not None:          # its token was drawn without its grammar: not kept
                self._finish(item.seq, FinishReason.ERROR, error=item.seq.failure)
                continue
            if item.seq.score_from:
                self._scored(item)
                continue
            if result is not None:
                self._counters["tokens"] += len(result.tokens)      # counted before a client can have them
                self._emit(item, result, interval)
        self._recent.append((time.perf_counter(), self._counters["tokens"]))
        if self.connector is not None:
            self.connector.after_step(work, elapsed)

    def _stream_interval(self) -> int:
        """Tokens per streamed message. Every message costs its consumer (the gRPC server) ~0.1 ms of CPU,
        under the GIL this loop needs too when the server runs it in process, so adaptively (0) a message carries
        running // MESSAGES_PER_STEP tokens (at least 1): a message per token below 8 running requests, then 4 to 7
        a step."""
        return self.config.stream_interval or max(1, len(self.scheduler.running) // MESSAGES_PER_STEP)

    def _emit(self, item: Work, result: Sampled, interval: int) -> None:
        seq = item.seq
        if seq.forced is not None:      # the continuation's given token: recorded, not streamed (the caller has it)
            seq.forced = None
            seq.token_ids.extend(result.tokens)
            seq.logprobs.extend(result.logprobs)
            seq.versions.append(seq.handover_version)
            return
        cached, first = 0, seq.first_token is None
        if first:                   # sent at once, whatever the stream interval: time to first token
            seq.first_token = time.perf_counter()
            cached = seq.prefix_hit_tokens
        versions = [self.version_of(seq)] * len(result.tokens)
        seq.token_ids.extend(result.tokens)
        seq.logprobs.extend(result.logprobs)
        seq.versions.extend(versions)
        finish = None
        if result.tokens and result.tokens[-1] in seq.stop_ids:
            finish = FinishReason.STOP
        elif seq.num_output >= seq.max_tokens:
            finish = FinishReason.LENGTH
        chunk = seq.unsent
        if chunk is None:           # the step's result is not kept: its lists become the chunk's
            chunk = seq.unsent = TokenChunk(result.tokens, result.logprobs, versions, result.top or [],
                                            cached_prompt_tokens=cached)
        else:
            chunk.token_ids += result.tokens
            chunk.logprobs += result.logprobs
            chunk.weight_versions += versions
            chunk.top_logprobs += result.top or []
        if finish is not None:
            self._finish(seq, finish)
        elif first or len(chunk.token_ids) >= (seq.stream_interval or interval):
            seq.unsent = None
            seq.stream.put(chunk)

    def _scored(self, item: Work) -> None:
        """Version the scores the step added; once every token is scored, send them all and end the request."""
        seq = item.seq
        seq.score_versions.extend([self.version_of(seq)] * (len(seq.scores) - len(seq.score_versions)))
        if item.end < len(seq.token_ids):
            return
        self._counters["scored_tokens"] += len(seq.scores)
        seq.first_token = time.perf_counter()
        seq.unsent = TokenChunk(seq.token_ids[seq.score_from:], seq.scores, seq.score_versions,
                                cached_prompt_tokens=seq.prefix_hit_tokens)
        self._finish(seq, FinishReason.STOP)

    def _routed_experts(self, seq: Sequence) -> RoutedExperts | None:
        """The routing of every position the sequence fed through the model (all but its last token), for a model
        with experts whose sequence holds its blocks."""
        positions = min(seq.num_computed, len(seq.token_ids) - 1)
        if self.cache.routing is None or not seq.block_table or positions <= 0:
            return None
        ids = self.cache.routing_of(seq.block_table, positions).cpu().numpy()
        return RoutedExperts(ids, self.model.config.num_experts)

    def _stale_handover(self, seq: Sequence) -> bool:
        """Refuse (retryably) a continuation whose first tokens another weight version sampled."""
        if seq.handover_version is None or seq.handover_version == self._version:
            return False
        self._finish(seq, FinishReason.ERROR, retryable=True,
                     error=f"the continuation was sampled by weight version {seq.handover_version}, this actor runs "
                           f"{self._version}; prefill it again")
        return True

    def _finish(self, seq: Sequence, reason: FinishReason, error: str = "", retryable: bool = False) -> None:
        if seq.status is Status.FINISHED:
            return
        deliver = seq.stream.put
        if seq.prefill_only and reason in (FinishReason.STOP, FinishReason.LENGTH):
            deliver = self.connector.hand_over(seq)      # its blocks are copied now, before they are freed
        routed = self._routed_experts(seq)               # read before the blocks are freed too
        self.scheduler.finish(seq)
        self.ledger.live.pop(seq.request_id, None)
        self._counters["finished"] += 1
        now = time.perf_counter()
        chunk, seq.unsent = seq.unsent or TokenChunk(), None       # tokens not sent yet end with the request
        chunk.finish_reason, chunk.error, chunk.retryable = reason, error, retryable
        chunk.routed_experts = routed
        chunk.continues = seq.prefill_only and reason is FinishReason.LENGTH and seq.room > 1
        admitted = seq.admitted or now
        first = seq.first_token or now
        chunk.queue_s, chunk.prefill_s = admitted - seq.arrived, first - admitted
        chunk.decode_s, chunk.total_s = now - first, now - seq.arrived
        deliver(chunk)

