"""``PoolClient``: the Pool service over gRPC with the same methods as the in-process ``Pool``, raising the same
exceptions, so the learner and the gateway can use either."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import grpc

from forge.pool.errors import error_for_status
from forge.rpc import connect
from forge.v1 import common_pb2, pool_pb2, pool_pb2_grpc

# Codes only the pool sends; UNAVAILABLE, INTERNAL, DEADLINE_EXCEEDED... stay grpc.RpcError.
_POOL_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ABORTED,
                         grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED})


def _pool_error(exc: grpc.RpcError) -> Exception:
    """The pool's exception for a status only the pool sends, else the transport's error as it is."""
    if exc.code() not in _POOL_CODES:
        return exc
    return error_for_status(exc.code(), exc.details() or "")


class PoolClient:
    """A client of the Pool service at ``address`` (host:port). Errors the service reports come back as the pool's
    exceptions (``InvalidRequestError``, ``NotFoundError``, ``ConflictError``, ``PoolFullError``...); transport
    failures stay ``grpc.RpcError``."""

    def __init__(self, address: str, api_key: str | None = None, timeout_s: float | None = 60.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.channel = connect(address, api_key)
        self.stub = pool_pb2_grpc.PoolStub(self.channel)

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise _pool_error(exc) from exc

    def _call_async(self, method: str, request: Any, answer: Callable[[Any], Any] = lambda response: response
                    ) -> Future:
        """The call under way; its future gives ``answer(response)``, or the error ``_call`` would raise. Nothing
        waits in a thread: gRPC completes the call and runs the callback."""
        done: Future = Future()
        call = getattr(self.stub, method).future(request, timeout=self.timeout_s)

        def finish(call: grpc.Future) -> None:
            try:
                done.set_result(answer(call.result()))
            except grpc.RpcError as exc:
                done.set_exception(_pool_error(exc))
            except BaseException as exc:        # cancelled: the caller's future says so
                done.set_exception(exc)

        call.add_done_callback(finish)
        return done

    def open_session(self, request: pool_pb2.OpenSessionRequest | None = None, /, **fields: Any
                     ) -> pool_pb2.SessionRecord:
        return self._call("OpenSession", request if request is not None else pool_pb2.OpenSessionRequest(**fields))

    def append_call(self, record: pool_pb2.CallRecord) -> int:
        return self._call("AppendCall", record).index

    # The writes a gateway makes for every session and call, as futures (``Pool``'s interface): awaited on its event
    # loop, they hold none of its threads.
    def open_session_async(self, request: pool_pb2.OpenSessionRequest) -> Future:
        return self._call_async("OpenSession", request)

    def append_call_async(self, record: pool_pb2.CallRecord) -> Future:
        return self._call_async("AppendCall", record, lambda response: response.index)

    def close_session_async(self, request: pool_pb2.CloseSessionRequest) -> Future:
        return self._call_async("CloseSession", request)

    def add_process_reward(self, session_id: str, call_index: int, reward: float) -> None:
        self._call("AddProcessReward", pool_pb2.ProcessReward(session_id=session_id, call_index=call_index,
                                                              reward=reward))

    def close_session(self, request: pool_pb2.CloseSessionRequest | None = None, /, **fields: Any
                      ) -> pool_pb2.SessionRecord:
        return self._call("CloseSession", request if request is not None else pool_pb2.CloseSessionRequest(**fields))

    def expire_sessions(self, older_than_s: float) -> list[str]:
        return list(self._call("ExpireSessions", pool_pb2.ExpireSessionsRequest(idle_s=older_than_s)).session_ids)

    def fetch(self, window: int, max_entries: int = 0, include_calls: bool = False) -> pool_pb2.FetchResponse:
        return self._call("Fetch", pool_pb2.FetchRequest(window=window, max_entries=max_entries,
                                                         include_calls=include_calls))

    def consume(self, positions: Iterable[int], failed: bool = False, expected_seq: int | None = None,
                commit: bool = False) -> pool_pb2.Cursor:
        request = pool_pb2.ConsumeRequest(positions=list(positions), failed=failed, commit=commit)
        if expected_seq is not None:
            request.expected_seq = expected_seq
        return self._call("Consume", request).cursor

    def cursor(self) -> pool_pb2.Cursor:
        return self._call("GetCursor", pool_pb2.GetCursorRequest())

    def commit_cursor(self, seq: int) -> pool_pb2.Cursor:
        return self._call("CommitCursor", pool_pb2.CommitCursorRequest(seq=seq))

    def rewind(self, seq: int) -> pool_pb2.Cursor:
        return self._call("RewindCursor", pool_pb2.RewindCursorRequest(seq=seq))

    def get_session(self, session_id: str) -> pool_pb2.SessionWithCalls:
        return self._call("GetSession", pool_pb2.GetSessionRequest(session_id=session_id))

    def stats_report(self) -> common_pb2.StatsReport:
        return self._call("Stats", common_pb2.StatsRequest())

    def stats(self) -> dict[str, float]:
        return dict(self.stats_report().gauges)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
