"""The TensorRT-LLM backend, through its LLM API (GPU only; ``pip install --extra-index-url https://pypi.nvidia.com
"forge-rl[trtllm]"``). TensorRT-LLM is imported lazily, so everything else works without it.

Generation maps one-to-one: prompt token ids in, ``generate_async(..., streaming=True)`` out, the sampled token ids
with the log-probability of each (``logprobs_mode="processed"``: under the distribution sampled from) stamped with
the weight version in use; abort cancels the request. New weights go through TensorRT-LLM's RL weight-update path:
tensors are staged on the GPU, shared as CUDA IPC handles with its Ray workers (``WorkerExtension.update_weights``),
then finalised, which also resets its prefix cache.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import torch

from forge.actors.backend import (
    Backend,
    FinishReason,
    GenerationRequest,
    InvalidRequest,
    Ledger,
    RequestStream,
    TokenChunk,
)
from forge.actors.kinds import TRTLLM
from forge.model.lora_weights import is_adapter_version
from forge.sampling.params import SamplingParams

log = logging.getLogger(__name__)

WORKER_EXTENSION = "tensorrt_llm.llmapi.rlhf_utils.WorkerExtension"
TRTLLM_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "cancelled": FinishReason.ABORT,
                 "abort": FinishReason.ABORT}


def sampling_kwargs(params: SamplingParams, eos_token_ids: tuple[int, ...]) -> dict[str, Any]:
    """Our sampling parameters as TensorRT-LLM ``SamplingParams`` keyword arguments."""
    kwargs: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "logprobs": 1,
        "detokenize": False,
        "stop_token_ids": list(params.stop_token_ids),
    }
    if params.greedy:
        kwargs.update(temperature=0.0, top_k=1)
    else:
        kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None)
    if params.seed is not None:
        kwargs["seed"] = params.seed
    if params.ignore_eos:
        kwargs["ignore_eos"] = True
    elif eos_token_ids:
        kwargs["end_id"] = eos_token_ids[0]
        kwargs["stop_token_ids"] += list(eos_token_ids[1:])
    return kwargs


def _logprob_of(entry: Any, token: int) -> float:
    """One element of ``CompletionOutput.logprobs``: a float, or a {token id: Logprob} mapping."""
    if isinstance(entry, int | float):
        return float(entry)
    if isinstance(entry, Mapping):
        value = entry[token]
        return float(getattr(value, "logprob", value))
    return float(getattr(entry, "logprob", entry))


def chunk_from_output(output: Any, already_sent: int, version: int) -> tuple[TokenChunk, int]:
    """The new tokens of a streamed ``RequestOutput`` as a chunk; returns it and the count of tokens sent so far."""
    completion = output.outputs[0]
    token_ids = list(completion.token_ids)
    fresh = token_ids[already_sent:]
    logprobs = list(completion.logprobs or [])[already_sent:len(token_ids)]
    chunk = TokenChunk(fresh, [_logprob_of(e, t) for e, t in zip(logprobs, fresh, strict=True)], [version] * len(fresh))
    if getattr(output, "finished", False):
        reason = str(getattr(completion, "finish_reason", None) or "stop")
        chunk.finish_reason = TRTLLM_FINISH.get(reason, FinishReason.STOP)
    return chunk, len(token_ids)


def ipc_handles(state_dict: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, list]:
    """CUDA IPC handles of ``state_dict`` staged on ``device``, keyed by the device's UUID, in the shape
    ``WorkerExtension.update_weights`` takes."""
    from torch.multiprocessing.reductions import reduce_tensor

    uuid_of_device = str(torch.cuda.get_device_properties(device).uuid)
    handles = [(name, reduce_tensor(tensor.to(device, non_blocking=True).contiguous()))
               for name, tensor in state_dict.items()]
    torch.cuda.synchronize(device)
    return {uuid_of_device: handles}


class TrtllmBackend(Backend):
    kind = TRTLLM

    def __init__(self, model_dir: str, vocab_size: int, max_context: int, eos_token_ids: tuple[int, ...],
                 max_waiting: int = 1024, kv_cache_fraction: float = 0.8) -> None:
        try:
            from tensorrt_llm import LLM
            from tensorrt_llm.llmapi import KvCacheConfig
        except ImportError as exc:
            raise RuntimeError("TensorRT-LLM is not installed: pip install --extra-index-url https://pypi.nvidia.com "
                               "'forge-rl[trtllm]' on a CUDA machine (see docs/backends.md)") from exc
        self.vocab_size, self.max_context, self.eos_token_ids = vocab_size, max_context, eos_token_ids
        self.max_waiting = max_waiting
        self.llm = LLM(model=model_dir, orchestrator_type="ray", ray_worker_extension_cls=WORKER_EXTENSION,
                       kv_cache_config=KvCacheConfig(enable_block_reuse=True,
                                                     free_gpu_memory_fraction=kv_cache_fraction))
        self._version = 0
        # the version in use, and the requests in flight: each with its TensorRT-LLM result once it has started
        self.ledger = Ledger(self._version, max_waiting)
        self._lock = threading.Lock()
        self._counters = {"tokens": 0, "finished": 0, "weight_swaps": 0}
        self._started = time.time()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtllm-loop", daemon=True)
        self._thread.start()

    @property
    def weight_version(self) -> int:
        return self._version

    def submit(self, request: GenerationRequest) -> RequestStream:
        prompt = list(request.prompt_ids)
        if not prompt:
            raise InvalidRequest("the prompt is empty: give at least one token id")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(f"token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        if len(prompt) >= self.max_context:
            raise InvalidRequest(f"the prompt has {len(prompt)} tokens; the context is {self.max_context}")
        from tensorrt_llm import SamplingParams as TrtSamplingParams

        params = request.params
        for name in ("min_tokens", "top_logprobs", "logit_bias", "frequency_penalty", "presence_penalty",
                     "grammar"):
            if getattr(params, name):
                raise InvalidRequest(f"{name} is not supported by the TensorRT-LLM backend")
        if params.repetition_penalty != 1.0:
            raise InvalidRequest("repetition_penalty is not supported by the TensorRT-LLM backend")
        if params.max_tokens is None:
            params = SamplingParams(**{**params.__dict__, "max_tokens": self.max_context - len(prompt)})
        kwargs = sampling_kwargs(params, self.eos_token_ids)
        try:
            trt_params = TrtSamplingParams(logprobs_mode="processed", **kwargs)
        except TypeError:     # releases without logprobs_mode return processed log-probs already
            trt_params = TrtSamplingParams(**kwargs)
        request_id = request.request_id or uuid.uuid4().hex
        stream = RequestStream(request_id)
        with self._lock:
            self.ledger.admit(request_id, None)
        asyncio.run_coroutine_threadsafe(self._run(request_id, prompt, trt_params, stream), self._loop)
        return stream

    async def _run(self, request_id: str, prompt: list[int], params: Any, stream: RequestStream) -> None:
        started = time.perf_counter()
        first: float | None = None
        sent = 0
        result = self.llm.generate_async(prompt, params, streaming=True)
        self.ledger.live[request_id] = result
        try:
            async for output in result:
                chunk, sent = chunk_from_output(output, sent, self._version)
                first = first or time.perf_counter()
                self._counters["tokens"] += len(chunk.token_ids)
                if chunk.finish_reason is not None:
                    now = time.perf_counter()
                    chunk.prefill_s, chunk.decode_s, chunk.total_s = first - started, now - first, now - started
                stream.put(chunk)
        except Exception as exc:
            log.exception("TensorRT-LLM request %s failed", request_id)
            stream.put(TokenChunk(finish_reason=FinishReason.ERROR, error=str(exc)))
        finally:
            self.ledger.live.pop(request_id, None)
            self._counters["finished"] += 1
            if not stream.finished.is_set():
                stream.put(TokenChunk(finish_reason=FinishReason.ABORT))

    def abort(self, request_id: str) -> bool:
        result = self.ledger.live.get(request_id)
        if result is None:
            return False
        result.abort()
        return True

    def load_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        if is_adapter_version(state_dict):
            raise ValueError(f"weight version {version} holds LoRA adapters only, which TensorRT-LLM is not given "
                             f"here: publish merged weights ([learner] lora_publish = \"merged\")")
        self.ledger.check_version(version)
        started = time.perf_counter()
        handles = ipc_handles(state_dict, torch.device("cuda"))
        self.llm._collective_rpc("update_weights", args=(handles,))
        self.llm._collective_rpc("update_weights", args=(None,))      # finalise; resets the prefix cache
        self._version = self.ledger.accepted_version = version
        self._counters["weight_swaps"] += 1
        log.info("applied weight version %d in %.1f ms", version, (time.perf_counter() - started) * 1e3)

    def stats(self) -> dict[str, float]:
        return {"running": float(len(self.ledger.live)), "weight_version": float(self._version),
                **{k: float(v) for k, v in self._counters.items()}}

    def close(self) -> None:
        for request_id in list(self.ledger.live):
            self.abort(request_id)
        self.llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
