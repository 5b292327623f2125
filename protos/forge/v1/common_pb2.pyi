from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_ERROR: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "max_tokens", "stop_token_ids", "ignore_eos", "min_tokens", "top_logprobs", "logit_bias", "frequency_penalty", "presence_penalty", "repetition_penalty", "grammar")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    min_tokens: int
    top_logprobs: int
    logit_bias: _containers.ScalarMap[int, float]
    frequency_penalty: float
    presence_penalty: float
    repetition_penalty: float
    grammar: Grammar
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., top_logprobs: _Optional[int] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., grammar: _Optional[_Union[Grammar, _Mapping]] = ...) -> None: ...

class Grammar(_message.Message):
    __slots__ = ("json_schema", "json_object", "lark")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    LARK_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    lark: str
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., lark: _Optional[str] = ...) -> None: ...

class TopLogprobs(_message.Message):
    __slots__ = ("token_ids", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ExpertRouting(_message.Message):
    __slots__ = ("layers", "top_k", "num_experts", "ids")
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    layers: int
    top_k: int
    num_experts: int
    ids: bytes
    def __init__(self, layers: _Optional[int] = ..., top_k: _Optional[int] = ..., num_experts: _Optional[int] = ..., ids: _Optional[bytes] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_s", "prefill_s", "decode_s", "total_s", "tool_s")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    TOOL_S_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    prefill_s: float
    decode_s: float
    total_s: float
    tool_s: float
    def __init__(self, queue_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., total_s: _Optional[float] = ..., tool_s: _Optional[float] = ...) -> None: ...

class DeviceStats(_message.Message):
    __slots__ = ("index", "name", "utilization_pct", "memory_utilization_pct", "memory_used_bytes", "memory_total_bytes", "power_w", "power_limit_w", "temperature_c", "sm_clock_mhz", "memory_clock_mhz", "process_memory_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    PROCESS_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    utilization_pct: float
    memory_utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_w: float
    power_limit_w: float
    temperature_c: float
    sm_clock_mhz: float
    memory_clock_mhz: float
    process_memory_bytes: int
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., utilization_pct: _Optional[float] = ..., memory_utilization_pct: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., power_w: _Optional[float] = ..., power_limit_w: _Optional[float] = ..., temperature_c: _Optional[float] = ..., sm_clock_mhz: _Optional[float] = ..., memory_clock_mhz: _Optional[float] = ..., process_memory_bytes: _Optional[int] = ...) -> None: ...

class HostStats(_message.Message):
    __slots__ = ("cpu_pct", "cpu_count", "memory_used_bytes", "memory_total_bytes", "process_rss_bytes", "gpu_available", "gpu_unavailable_reason")
    CPU_PCT_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESS_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    GPU_UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    cpu_pct: float
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int
    process_rss_bytes: int
    gpu_available: bool
    gpu_unavailable_reason: str
    def __init__(self, cpu_pct: _Optional[float] = ..., cpu_count: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., process_rss_bytes: _Optional[int] = ..., gpu_available: _Optional[bool] = ..., gpu_unavailable_reason: _Optional[str] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReport(_message.Message):
    __slots__ = ("service", "instance", "version", "uptime_s", "timestamp", "gauges", "labels", "devices", "host")
    class GaugesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    GAUGES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    service: str
    instance: str
    version: str
    uptime_s: float
    timestamp: float
    gauges: _containers.ScalarMap[str, float]
    labels: _containers.ScalarMap[str, str]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceStats]
    host: HostStats
    def __init__(self, service: _Optional[str] = ..., instance: _Optional[str] = ..., version: _Optional[str] = ..., uptime_s: _Optional[float] = ..., timestamp: _Optional[float] = ..., gauges: _Optional[_Mapping[str, float]] = ..., labels: _Optional[_Mapping[str, str]] = ..., devices: _Optional[_Iterable[_Union[DeviceStats, _Mapping]]] = ..., host: _Optional[_Union[HostStats, _Mapping]] = ...) -> None: ...
