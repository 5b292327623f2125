from forge.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATUS_UNSPECIFIED: _ClassVar[SessionStatus]
    SESSION_STATUS_OPEN: _ClassVar[SessionStatus]
    SESSION_STATUS_COMPLETED: _ClassVar[SessionStatus]
    SESSION_STATUS_FAILED: _ClassVar[SessionStatus]

class EntryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_STATUS_UNSPECIFIED: _ClassVar[EntryStatus]
    ENTRY_STATUS_PENDING: _ClassVar[EntryStatus]
    ENTRY_STATUS_COMPLETED: _ClassVar[EntryStatus]
    ENTRY_STATUS_CONSUMED: _ClassVar[EntryStatus]
    ENTRY_STATUS_FAILED: _ClassVar[EntryStatus]
SESSION_STATUS_UNSPECIFIED: SessionStatus
SESSION_STATUS_OPEN: SessionStatus
SESSION_STATUS_COMPLETED: SessionStatus
SESSION_STATUS_FAILED: SessionStatus
ENTRY_STATUS_UNSPECIFIED: EntryStatus
ENTRY_STATUS_PENDING: EntryStatus
ENTRY_STATUS_COMPLETED: EntryStatus
ENTRY_STATUS_CONSUMED: EntryStatus
ENTRY_STATUS_FAILED: EntryStatus

class OpenSessionRequest(_message.Message):
    __slots__ = ("session_id", "task_id", "domain", "group_id", "group_size", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task_id: str
    domain: str
    group_id: str
    group_size: int
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., domain: _Optional[str] = ..., group_id: _Optional[str] = ..., group_size: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SessionRecord(_message.Message):
    __slots__ = ("session_id", "task_id", "domain", "group_id", "group_size", "queue_position", "status", "outcome_rewards", "metrics", "num_calls", "started_at", "ended_at", "failure_reason", "metadata")
    class OutcomeRewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_REWARDS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    NUM_CALLS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task_id: str
    domain: str
    group_id: str
    group_size: int
    queue_position: int
    status: SessionStatus
    outcome_rewards: _containers.ScalarMap[str, float]
    metrics: _containers.ScalarMap[str, float]
    num_calls: int
    started_at: float
    ended_at: float
    failure_reason: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., domain: _Optional[str] = ..., group_id: _Optional[str] = ..., group_size: _Optional[int] = ..., queue_position: _Optional[int] = ..., status: _Optional[_Union[SessionStatus, str]] = ..., outcome_rewards: _Optional[_Mapping[str, float]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., num_calls: _Optional[int] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., failure_reason: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CallRecord(_message.Message):
    __slots__ = ("session_id", "index", "prompt_ids", "completion_ids", "logprobs", "weight_versions", "actor", "timing", "finish_reason", "process_rewards", "sampling", "created_at", "routed_experts", "adapter", "prompt_shared")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROCESS_REWARDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_SHARED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    index: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    completion_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    weight_versions: _containers.RepeatedScalarFieldContainer[int]
    actor: str
    timing: _common_pb2.Timing
    finish_reason: _common_pb2.FinishReason
    process_rewards: _containers.RepeatedScalarFieldContainer[float]
    sampling: _common_pb2.SamplingParams
    created_at: float
    routed_experts: _common_pb2.ExpertRouting
    adapter: str
    prompt_shared: int
    def __init__(self, session_id: _Optional[str] = ..., index: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., completion_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., weight_versions: _Optional[_Iterable[int]] = ..., actor: _Optional[str] = ..., timing: _Optional[_Union[_common_pb2.Timing, _Mapping]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., process_rewards: _Optional[_Iterable[float]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., created_at: _Optional[float] = ..., routed_experts: _Optional[_Union[_common_pb2.ExpertRouting, _Mapping]] = ..., adapter: _Optional[str] = ..., prompt_shared: _Optional[int] = ...) -> None: ...

class AppendCallResponse(_message.Message):
    __slots__ = ("index",)
    INDEX_FIELD_NUMBER: _ClassVar[int]
    index: int
    def __init__(self, index: _Optional[int] = ...) -> None: ...

class ProcessReward(_message.Message):
    __slots__ = ("session_id", "call_index", "reward")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_INDEX_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    call_index: int
    reward: float
    def __init__(self, session_id: _Optional[str] = ..., call_index: _Optional[int] = ..., reward: _Optional[float] = ...) -> None: ...

class AddProcessRewardResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id", "failed", "failure_reason", "outcome_rewards", "metrics")
    class OutcomeRewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_REWARDS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    failed: bool
    failure_reason: str
    outcome_rewards: _containers.ScalarMap[str, float]
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, session_id: _Optional[str] = ..., failed: _Optional[bool] = ..., failure_reason: _Optional[str] = ..., outcome_rewards: _Optional[_Mapping[str, float]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("window", "max_entries", "include_calls")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CALLS_FIELD_NUMBER: _ClassVar[int]
    window: int
    max_entries: int
    include_calls: bool
    def __init__(self, window: _Optional[int] = ..., max_entries: _Optional[int] = ..., include_calls: _Optional[bool] = ...) -> None: ...

class QueueEntry(_message.Message):
    __slots__ = ("position", "group_id", "status", "sessions")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    position: int
    group_id: str
    status: EntryStatus
    sessions: _containers.RepeatedCompositeFieldContainer[SessionWithCalls]
    def __init__(self, position: _Optional[int] = ..., group_id: _Optional[str] = ..., status: _Optional[_Union[EntryStatus, str]] = ..., sessions: _Optional[_Iterable[_Union[SessionWithCalls, _Mapping]]] = ...) -> None: ...

class SessionWithCalls(_message.Message):
    __slots__ = ("session", "calls")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    session: SessionRecord
    calls: _containers.RepeatedCompositeFieldContainer[CallRecord]
    def __init__(self, session: _Optional[_Union[SessionRecord, _Mapping]] = ..., calls: _Optional[_Iterable[_Union[CallRecord, _Mapping]]] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("head", "tail", "entries", "seq")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    head: int
    tail: int
    entries: _containers.RepeatedCompositeFieldContainer[QueueEntry]
    seq: int
    def __init__(self, head: _Optional[int] = ..., tail: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[QueueEntry, _Mapping]]] = ..., seq: _Optional[int] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("positions", "failed", "expected_seq", "commit")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SEQ_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    failed: bool
    expected_seq: int
    commit: bool
    def __init__(self, positions: _Optional[_Iterable[int]] = ..., failed: _Optional[bool] = ..., expected_seq: _Optional[int] = ..., commit: _Optional[bool] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("head", "cursor")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    head: int
    cursor: Cursor
    def __init__(self, head: _Optional[int] = ..., cursor: _Optional[_Union[Cursor, _Mapping]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class Cursor(_message.Message):
    __slots__ = ("head", "tail", "seq", "committed_seq", "committed_head")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_SEQ_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_HEAD_FIELD_NUMBER: _ClassVar[int]
    head: int
    tail: int
    seq: int
    committed_seq: int
    committed_head: int
    def __init__(self, head: _Optional[int] = ..., tail: _Optional[int] = ..., seq: _Optional[int] = ..., committed_seq: _Optional[int] = ..., committed_head: _Optional[int] = ...) -> None: ...

class GetCursorRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CommitCursorRequest(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class RewindCursorRequest(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class ExpireSessionsRequest(_message.Message):
    __slots__ = ("idle_s",)
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    idle_s: float
    def __init__(self, idle_s: _Optional[float] = ...) -> None: ...

class ExpireSessionsResponse(_message.Message):
    __slots__ = ("session_ids",)
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ...) -> None: ...
