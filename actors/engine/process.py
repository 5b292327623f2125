"""``EngineProcess``: the torch engine run in a process of its own (``forge.actors.engine.core``), behind the same
``Backend`` interface as the in-process engine.

The front, in the server's process, checks each request against the core's limits (so bad requests still fail at
``submit`` with the reason), keeps the requests' streams, and hands the rest to the core over ZeroMQ; one thread
receives the core's chunks, a message per engine step, and puts them on their streams. If the core dies, every
open stream ends with an error, ``submit`` refuses, and ``on_exit`` is told, so that a server can stop and be
restarted rather than serve nothing.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import torch
import zmq

from forge.actors.backend import (
    Backend,
    FinishReason,
    GenerationRequest,
    Ledger,
    RequestStream,
    TokenChunk,
    batched_wakeups,
    check_weights,
)
from forge.actors.engine.core import CoreInfo, EngineSpec
from forge.actors.kinds import TORCH
from forge.model.lora_weights import is_adapter_version
from forge.v1 import router_pb2

log = logging.getLogger(__name__)


class EngineProcess(Backend):
    kind = TORCH

    def __init__(self, spec: EngineSpec, start_timeout_s: float = 600.0,
                 on_exit: Callable[[str], None] | None = None, call_timeout_s: float = 30.0) -> None:
        self.spec = spec
        self.on_exit = on_exit
        self.call_timeout_s = call_timeout_s
        self._dir = tempfile.mkdtemp(prefix="forge-engine-")        # mode 0700: only this user reaches the sockets
        self._context = zmq.Context()
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.setsockopt(zmq.SNDHWM, 0)        # never block a handler: requests in flight are bounded anyway
        self._push.bind(f"ipc://{self._dir}/commands")
        self._pull = self._context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(f"ipc://{self._dir}/outputs")
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._calls: dict[int, Future] = {}
        self._call_ids = itertools.count()
        self._closed = False
        self._exit_reason = ""
        self._failed = False
        self._proc = subprocess.Popen([
            sys.executable, "-m", "forge.actors.engine.core", "--commands", f"ipc://{self._dir}/commands",
            "--outputs", f"ipc://{self._dir}/outputs", "--parent", str(os.getpid())])
        try:
            self.info = self._start(start_timeout_s)
        except BaseException:
            self._stop_process()
            self._release()
            raise
        self._limits = self.info.limits
        self._version = self.info.weight_version
        self._adapter_versions = dict(self.info.adapter_versions)     # served by the core, as of its last message
        # versions sent, adapters the core accepted through load_adapter (maybe not yet served), live streams
        self.ledger = Ledger(self._version, self._limits.max_in_flight)
        self._receiver = threading.Thread(target=self._receive, name="engine-front", daemon=True)
        self._receiver.start()
        log.info("engine core running in process %d (model %s)", self._proc.pid, self.info.model_id)

    def _start(self, timeout_s: float) -> CoreInfo:
        deadline = time.monotonic() + timeout_s
        spec = pickle.dumps(("spec", self.spec), protocol=pickle.HIGHEST_PROTOCOL)
        while not self._push.poll(200, zmq.POLLOUT):      # until the core has connected
            self._check_starting(deadline)
        self._push.send(spec)
        while not self._pull.poll(200):
            self._check_starting(deadline)
        message = pickle.loads(self._pull.recv())
        if message[0] == "failed":
            raise RuntimeError(f"the engine process could not start: {message[1]}")
        return message[1]

    def _check_starting(self, deadline: float) -> None:
        code = self._proc.poll()
        if code is not None:
            raise RuntimeError(f"the engine process exited with code {code} while starting (see its log above)")
        if time.monotonic() > deadline:
            raise TimeoutError("the engine process did not start in time")

    # ------------------------------------------------------------------ interface

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def adapter_versions(self) -> dict[str, int]:
        return self._adapter_versions

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def failed(self) -> bool:
        """The core exited without being closed: nothing more will be served."""
        return self._failed

    def submit(self, request: GenerationRequest) -> RequestStream:
        self._limits.check(request)
        self.ledger.check_adapter_named(request, self._adapter_versions)
        request_id = request.request_id or uuid.uuid4().hex
        stream = RequestStream(request_id)
        with self._lock:
            self.ledger.admit(request_id, stream, self._refusal())
        self._send(("submit", request if request.request_id else replace(request, request_id=request_id)))
        return stream

    def _refusal(self) -> str:
        if self._exit_reason:
            return f"the engine process is not running: {self._exit_reason}"
        return "the engine is shutting down" if self._closed else ""

    def abort(self, request_id: str) -> bool:
        if request_id not in self.ledger.live:
            return False
        self._send(("abort", request_id))
        return True

    def load_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Sends the tensors to the core (a copy through the socket): for a learner's stream of versions, give the
        core the weight endpoints instead (``EngineSpec.weights_fetch``), so that it subscribes itself."""
        from safetensors.torch import save

        if not is_adapter_version(state_dict):          # the core merges an adapter version onto its model
            check_weights(version, state_dict, self.info.weight_shapes)
        with self._lock:
            self.ledger.accept_version(version)
        data = save({name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in state_dict.items()})
        self.call("load_weights", version, data)

    def load_adapter(self, name: str, version: int, adapter_version: Mapping[str, torch.Tensor]) -> None:
        """Sends the adapter's tensors to the core (for a learner's stream, give the core the adapter's endpoints
        instead: ``EngineSpec.adapters``)."""
        from safetensors.torch import save

        data = save({key: tensor.detach().to("cpu").contiguous().clone() for key, tensor in adapter_version.items()})
        self.call("load_adapter", name, version, data)
        with self._lock:
            self.ledger.adapters[name] = version

    def unload_adapter(self, name: str) -> None:
        """Tells the core to drop the named adapter."""
        self.call("unload_adapter", name)
        with self._lock:
            self.ledger.adapters.pop(name, None)

    def wait_for_version(self, version: int, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while self._version < version:
            if time.monotonic() > deadline or self._exit_reason:
                return False
            time.sleep(0.005)
        return True

    def stats(self) -> dict[str, float]:
        figures = dict(self.call("stats"))
        figures["refused"] = figures.get("refused", 0.0) + self.ledger.refused
        figures["engine_pid"] = float(self._proc.pid)
        return figures

    def kv_events(self) -> tuple[_RemoteEventLog, Callable[[], tuple[router_pb2.KVCacheLayout, dict[str, float]]]]:
        """The core's KV event log and figures, for a ``KVEventSourceServicer`` (needs ``EngineSpec.kv_events``)."""
        return _RemoteEventLog(self), self._describe_kv

    def _describe_kv(self) -> tuple[router_pb2.KVCacheLayout, dict[str, float]]:
        layout, figures = self.call("describe_kv")
        return router_pb2.KVCacheLayout.FromString(layout), figures

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method`` in the core and return its value; raises RuntimeError (ValueError for refused weights)."""
        if self._exit_reason:
            raise RuntimeError(f"the engine process is not running: {self._exit_reason}")
        future: Future = Future()
        call_id = next(self._call_ids)
        self._calls[call_id] = future
        self._send(("call", call_id, method, args))
        try:
            ok, value = future.result(timeout=self.call_timeout_s)
        except TimeoutError:
            raise RuntimeError(f"the engine process did not answer {method!r} within "
                               f"{self.call_timeout_s:.0f} s") from None
        finally:
            self._calls.pop(call_id, None)
        if not ok:
            raise (ValueError if method in ("load_weights", "load_adapter", "unload_adapter") else RuntimeError)(value)
        return value

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self._exit_reason:
            self._send(("close",))
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log.warning("the engine process did not stop within 60 s; killing it")
        self._stop_process()
        self._receiver.join(timeout=10)
        self._release()

    # ------------------------------------------------------------------ plumbing

    def _send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._push.send(data, copy=False)

    def _receive(self) -> None:
        """Put the core's chunks on their streams and its replies on their calls, until it exits."""
        while True:
            if self._pull.poll(500):
                self._handle(pickle.loads(self._pull.recv(copy=False).buffer))
                continue
            code = self._proc.poll()
            if code is not None:
                while self._pull.poll(0):             # what it sent before exiting
                    self._handle(pickle.loads(self._pull.recv(copy=False).buffer))
                self._exited(code)
                return

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "out":
            _, chunks, self._version, self._adapter_versions = message
            streams = self.ledger.live
            with batched_wakeups():
                for request_id, chunk in chunks:
                    stream = streams.get(request_id)
                    if stream is None:
                        continue
                    if chunk.finish_reason is not None:
                        with self._lock:
                            streams.pop(request_id, None)
                    stream.put(chunk)
        elif kind == "reply":
            _, call_id, ok, value = message
            future = self._calls.get(call_id)
            if future is not None:
                future.set_result((ok, value))
        else:
            log.error("unknown message %r from the engine process", kind)

    def _exited(self, code: int) -> None:
        reason = "closed" if self._closed else f"it exited with code {code}"
        with self._lock:
            self._exit_reason, self._failed = reason, not self._closed
            streams, self.ledger.live = self.ledger.live, {}
        for stream in streams.values():
            finish = FinishReason.ABORT if self._closed else FinishReason.ERROR
            stream.put(TokenChunk(finish_reason=finish, error=f"the engine process is not running: {reason}"))
        for future in list(self._calls.values()):
            if not future.done():
                future.set_result((False, f"the engine process is not running: {reason}"))
        if not self._closed:
            log.error("the engine process (pid %d) exited with code %d; %d requests failed", self._proc.pid, code,
                      len(streams))
            if self.on_exit is not None:
                self.on_exit(reason)

    def _stop_process(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=30)

    def _release(self) -> None:
        self._push.close()
        self._pull.close()
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)


class _RemoteEventLog:
    """``KVEventLog.poll`` answered by the engine core's log."""

    def __init__(self, engine: EngineProcess) -> None:
        self._engine = engine

    def poll(self, epoch: str, after: int, max_hashes: int = 100_000) -> router_pb2.KVEvents:
        return router_pb2.KVEvents.FromString(self._engine.call("poll_kv_events", epoch, after, max_hashes))
