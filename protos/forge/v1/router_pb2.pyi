from forge.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteRequest(_message.Message):
    __slots__ = ("request_id", "session_id", "group_id", "block_hashes", "num_prompt_tokens", "exclude")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session_id: str
    group_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    num_prompt_tokens: int
    exclude: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., session_id: _Optional[str] = ..., group_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., num_prompt_tokens: _Optional[int] = ..., exclude: _Optional[_Iterable[str]] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("actor", "address", "estimated_ttft_s", "local_cached_blocks", "fetched_blocks", "policy")
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_TTFT_S_FIELD_NUMBER: _ClassVar[int]
    LOCAL_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FETCHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    actor: str
    address: str
    estimated_ttft_s: float
    local_cached_blocks: int
    fetched_blocks: int
    policy: str
    def __init__(self, actor: _Optional[str] = ..., address: _Optional[str] = ..., estimated_ttft_s: _Optional[float] = ..., local_cached_blocks: _Optional[int] = ..., fetched_blocks: _Optional[int] = ..., policy: _Optional[str] = ...) -> None: ...

class KVEvent(_message.Message):
    __slots__ = ("kind", "block_hashes")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[KVEvent.Kind]
        KIND_STORED: _ClassVar[KVEvent.Kind]
        KIND_EVICTED: _ClassVar[KVEvent.Kind]
    KIND_UNSPECIFIED: KVEvent.Kind
    KIND_STORED: KVEvent.Kind
    KIND_EVICTED: KVEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    kind: KVEvent.Kind
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, kind: _Optional[_Union[KVEvent.Kind, str]] = ..., block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class KVEvents(_message.Message):
    __slots__ = ("actor", "events", "epoch", "sequence", "snapshot", "layout", "figures")
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    actor: str
    events: _containers.RepeatedCompositeFieldContainer[KVEvent]
    epoch: str
    sequence: int
    snapshot: bool
    layout: KVCacheLayout
    figures: _containers.ScalarMap[str, float]
    def __init__(self, actor: _Optional[str] = ..., events: _Optional[_Iterable[_Union[KVEvent, _Mapping]]] = ..., epoch: _Optional[str] = ..., sequence: _Optional[int] = ..., snapshot: _Optional[bool] = ..., layout: _Optional[_Union[KVCacheLayout, _Mapping]] = ..., figures: _Optional[_Mapping[str, float]] = ...) -> None: ...

class KVCacheLayout(_message.Message):
    __slots__ = ("model_id", "weight_version", "variant", "block_size", "block_bytes", "num_blocks", "max_running", "l3")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    L3_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    weight_version: int
    variant: str
    block_size: int
    block_bytes: int
    num_blocks: int
    max_running: int
    l3: bool
    def __init__(self, model_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., variant: _Optional[str] = ..., block_size: _Optional[int] = ..., block_bytes: _Optional[int] = ..., num_blocks: _Optional[int] = ..., max_running: _Optional[int] = ..., l3: _Optional[bool] = ...) -> None: ...

class PollKVEventsRequest(_message.Message):
    __slots__ = ("epoch", "after", "max_hashes")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    MAX_HASHES_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    after: int
    max_hashes: int
    def __init__(self, epoch: _Optional[str] = ..., after: _Optional[int] = ..., max_hashes: _Optional[int] = ...) -> None: ...

class KVEventsAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
