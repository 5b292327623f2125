"""JSON of the session endpoints: request bodies checked into pool requests, records written as plain objects."""

from __future__ import annotations

from typing import Any

from forge.gateway.errors import BadRequest
from forge.gateway.messages import INT32_MAX, finite_number
from forge.pool import SESSION_STATUS_NAMES
from forge.v1 import common_pb2, pool_pb2

FINISH_NAMES = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length",
                common_pb2.FINISH_REASON_ABORT: "abort", common_pb2.FINISH_REASON_ERROR: "error"}


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _text(body: dict, name: str) -> str:
    value = body.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string", name)
    return value


def _numbers(body: dict, name: str) -> dict[str, float]:
    value = body.get(name) or {}
    if not isinstance(value, dict) or not all(finite_number(v) for v in value.values()):
        raise BadRequest(f"{name} must map names to finite numbers", name)
    return {str(k): float(v) for k, v in value.items()}


def open_request(body: Any) -> tuple[pool_pb2.OpenSessionRequest, bool]:
    body = _object(body)
    size = body.get("group_size", 0) or 0
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= INT32_MAX:
        raise BadRequest(f"group_size must be an integer in [0, {INT32_MAX}]", "group_size")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadRequest("metadata must map names to strings", "metadata")
    issue = body.get("issue_api_key", True)
    if not isinstance(issue, bool):
        raise BadRequest("issue_api_key must be a boolean", "issue_api_key")
    request = pool_pb2.OpenSessionRequest(session_id=_text(body, "session_id"), task_id=_text(body, "task_id"),
                                          domain=_text(body, "domain"), group_id=_text(body, "group_id"),
                                          group_size=size, metadata={str(k): v for k, v in metadata.items()})
    return request, issue


def close_request(session_id: str, body: Any) -> pool_pb2.CloseSessionRequest:
    body = _object(body)
    failed = body.get("failed", False)
    if not isinstance(failed, bool):
        raise BadRequest("failed must be a boolean", "failed")
    return pool_pb2.CloseSessionRequest(session_id=session_id, failed=failed,
                                        failure_reason=_text(body, "failure_reason"),
                                        outcome_rewards=_numbers(body, "outcome_rewards"),
                                        metrics=_numbers(body, "metrics"))


def reward_request(body: Any) -> tuple[int, float]:
    body = _object(body)
    index, reward = body.get("call_index"), body.get("reward")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= INT32_MAX:
        raise BadRequest(f"call_index must be an integer in [0, {INT32_MAX}]", "call_index")
    if not finite_number(reward):
        raise BadRequest("reward must be a finite number", "reward")
    return index, float(reward)


def session_json(record: pool_pb2.SessionRecord) -> dict:
    return {"session_id": record.session_id, "task_id": record.task_id, "domain": record.domain,
            "group_id": record.group_id, "group_size": record.group_size, "queue_position": record.queue_position,
            "status": SESSION_STATUS_NAMES.get(record.status, "unknown"),
            "outcome_rewards": dict(record.outcome_rewards), "metrics": dict(record.metrics),
            "num_calls": record.num_calls, "started_at": record.started_at, "ended_at": record.ended_at,
            "failure_reason": record.failure_reason, "metadata": dict(record.metadata)}


def call_json(call: pool_pb2.CallRecord, include_ids: bool) -> dict:
    t = call.timing
    body = {"index": call.index, "prompt_tokens": len(call.prompt_ids), "completion_tokens": len(call.completion_ids),
            "finish_reason": FINISH_NAMES.get(call.finish_reason, "unspecified"), "actor": call.actor,
            "process_rewards": list(call.process_rewards), "created_at": call.created_at,
            "timing": {"queue_s": t.queue_s, "prefill_s": t.prefill_s, "decode_s": t.decode_s, "total_s": t.total_s,
                       "tool_s": t.tool_s}}
    if include_ids:
        body.update(prompt_ids=list(call.prompt_ids), completion_ids=list(call.completion_ids),
                    logprobs=list(call.logprobs), weight_versions=list(call.weight_versions))
    return body


def session_with_calls_json(stored: pool_pb2.SessionWithCalls, include_ids: bool = False) -> dict:
    return {"session": session_json(stored.session), "calls": [call_json(c, include_ids) for c in stored.calls]}
