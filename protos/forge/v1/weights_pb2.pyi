from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WeightStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_STATUS_UNSPECIFIED: _ClassVar[WeightStatus]
    WEIGHT_STATUS_OK: _ClassVar[WeightStatus]
    WEIGHT_STATUS_GONE: _ClassVar[WeightStatus]
    WEIGHT_STATUS_NO_VERSION: _ClassVar[WeightStatus]
    WEIGHT_STATUS_BAD_REQUEST: _ClassVar[WeightStatus]
WEIGHT_STATUS_UNSPECIFIED: WeightStatus
WEIGHT_STATUS_OK: WeightStatus
WEIGHT_STATUS_GONE: WeightStatus
WEIGHT_STATUS_NO_VERSION: WeightStatus
WEIGHT_STATUS_BAD_REQUEST: WeightStatus

class WeightTensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("version", "tensors", "total_bytes", "chunk_size", "hash_algorithm", "chunk_hashes", "version_hash", "publisher_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASH_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHUNK_HASHES_FIELD_NUMBER: _ClassVar[int]
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    tensors: _containers.RepeatedCompositeFieldContainer[WeightTensor]
    total_bytes: int
    chunk_size: int
    hash_algorithm: str
    chunk_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    version_hash: bytes
    publisher_id: str
    def __init__(self, version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[WeightTensor, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., chunk_size: _Optional[int] = ..., hash_algorithm: _Optional[str] = ..., chunk_hashes: _Optional[_Iterable[bytes]] = ..., version_hash: _Optional[bytes] = ..., publisher_id: _Optional[str] = ...) -> None: ...

class WeightAnnouncement(_message.Message):
    __slots__ = ("version", "version_hash", "total_bytes", "publisher_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    version_hash: bytes
    total_bytes: int
    publisher_id: str
    def __init__(self, version: _Optional[int] = ..., version_hash: _Optional[bytes] = ..., total_bytes: _Optional[int] = ..., publisher_id: _Optional[str] = ...) -> None: ...

class WeightManifestRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WeightChunkRequest(_message.Message):
    __slots__ = ("version", "index")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    version: int
    index: int
    def __init__(self, version: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class WeightRequest(_message.Message):
    __slots__ = ("manifest", "chunk")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightManifestRequest
    chunk: WeightChunkRequest
    def __init__(self, manifest: _Optional[_Union[WeightManifestRequest, _Mapping]] = ..., chunk: _Optional[_Union[WeightChunkRequest, _Mapping]] = ...) -> None: ...

class WeightChunkHeader(_message.Message):
    __slots__ = ("version", "index", "nbytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    version: int
    index: int
    nbytes: int
    def __init__(self, version: _Optional[int] = ..., index: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class WeightReply(_message.Message):
    __slots__ = ("status", "error", "latest_version", "manifest", "chunk")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    status: WeightStatus
    error: str
    latest_version: int
    manifest: WeightManifest
    chunk: WeightChunkHeader
    def __init__(self, status: _Optional[_Union[WeightStatus, str]] = ..., error: _Optional[str] = ..., latest_version: _Optional[int] = ..., manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., chunk: _Optional[_Union[WeightChunkHeader, _Mapping]] = ...) -> None: ...
