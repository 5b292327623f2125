"""The Tinker API's protobuf bodies (``forge.v1.tinker_wire``, wire-compatible with the SDK's tinker_public.proto):
forward_backward's request decoded and checked into ``Datum`` values (tokens packed as int32, loss inputs as dense
or sparse-CSR tensors; zstd-compressed when the client says so), and the two results the SDK reads as protobuf, a
forward pass's ``ForwardBackwardOutput`` and sampling's ``SampleResponse``, encoded."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from forge.learner.tinker.errors import ApiError, bad_request
from forge.learner.tinker.types import Datum, ForwardResult, SampledSequence
from forge.v1 import tinker_wire_pb2 as pb

PROTOBUF = "application/x-protobuf"
MAX_DATA = 65_536            # data per request
MAX_INPUTS = 32              # loss inputs per datum
MAX_DIMS = 4
MAX_CONFIG = 64              # loss_fn_config entries
EMPTY_TOPK_TOKEN, EMPTY_TOPK_LOGPROB = 0, -99999.0

_DTYPES = {pb.DTYPE_FLOAT32: np.dtype(np.float32), pb.DTYPE_INT64: np.dtype(np.int64)}
_STOP = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


@dataclass(frozen=True)
class ForwardRequest:
    model_id: str
    seq_id: int | None
    loss_fn: str
    loss_fn_config: dict[str, float] | None
    forward_only: bool
    data: list[Datum]

    @property
    def tokens(self) -> int:
        return sum(len(d.tokens) for d in self.data)


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """``body`` as sent (no Content-Encoding, or identity) or zstd-decompressed, at most ``max_bytes`` either way."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding != "zstd":
        raise ApiError(415, f"Content-Encoding {encoding!r} is not accepted (identity or zstd)")
    try:
        import zstandard
    except ImportError:
        raise ApiError(415, "zstd bodies are not accepted by this server (the zstandard package is missing)") from None
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(body)
        out = reader.read(max_bytes + 1)
    except zstandard.ZstdError as exc:
        raise bad_request(f"the zstd body does not decompress: {exc}") from None
    if len(out) > max_bytes:
        raise ApiError(413, f"the decompressed body is over {max_bytes} bytes")
    return out


def decode_forward(body: bytes) -> ForwardRequest:
    """A forward_backward request, checked (shapes, types, sizes); raises ApiError(400) saying what is wrong."""
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise bad_request(f"the body is not a ForwardBackwardRequest protobuf: {exc}") from None
    if not message.model_id:
        raise bad_request("model_id is required")
    if not message.loss_fn:
        raise bad_request("loss_fn is required")
    if not 0 < len(message.data) <= MAX_DATA:
        raise bad_request(f"a request holds 1 to {MAX_DATA} data, not {len(message.data)}")
    data = [_datum(d, i) for i, d in enumerate(message.data)]
    return ForwardRequest(model_id=message.model_id, seq_id=message.seq_id if message.seq_id > 0 else None,
                          loss_fn=message.loss_fn, loss_fn_config=_loss_config(message),
                          forward_only=message.forward_only, data=data)


def _loss_config(message: pb.ForwardBackwardRequest) -> dict[str, float] | None:
    if len(message.loss_fn_config_v2) + len(message.loss_fn_config) > 2 * MAX_CONFIG:
        raise bad_request(f"loss_fn_config has more than {MAX_CONFIG} entries")
    config: dict[str, float] = dict(message.loss_fn_config)
    for key, value in message.loss_fn_config_v2.items():       # the SDK writes both; v2 wins
        if value.WhichOneof("value") == "text":
            raise bad_request(f"loss_fn_config[{key!r}] is text; this server takes numbers only")
        config[key] = value.number
    for key, value in config.items():
        if not math.isfinite(value):
            raise bad_request(f"loss_fn_config[{key!r}] is not a finite number")
    return config or None


def _datum(message: pb.Datum, index: int) -> Datum:
    tokens: list[np.ndarray] = []
    for chunk in message.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise bad_request(f"data[{index}]: {kind or 'an empty'} chunk; this server takes token chunks only")
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise bad_request(f"data[{index}]: token bytes are not int32s")
        tokens.append(np.frombuffer(raw, dtype="<i4"))
    joined = np.concatenate(tokens).astype(np.int64) if tokens else np.zeros(0, np.int64)
    if joined.size == 0:
        raise bad_request(f"data[{index}]: model_input has no tokens")
    if (joined < 0).any():
        raise bad_request(f"data[{index}]: negative token id")
    if len(message.loss_fn_inputs) > MAX_INPUTS:
        raise bad_request(f"data[{index}]: more than {MAX_INPUTS} loss inputs")
    inputs = {name: tensor_array(t, f"data[{index}].loss_fn_inputs[{name!r}]")
              for name, t in message.loss_fn_inputs.items()}
    return Datum(tokens=joined, inputs=inputs)


def tensor_array(tensor: pb.Tensor, where: str) -> np.ndarray:
    """A wire tensor as a dense array (a sparse CSR one filled with 0 where unlisted)."""
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        raise bad_request(f"{where}: dtype must be float32 or int64")
    shape = [int(s) for s in tensor.shape]
    if len(shape) > MAX_DIMS or any(s < 0 for s in shape):
        raise bad_request(f"{where}: shape {shape} is not a shape of up to {MAX_DIMS} dimensions")
    if tensor.WhichOneof("encoding") == "sparse_csr":
        return _dense_from_csr(tensor.sparse_csr, dtype, shape, where)
    raw = tensor.dense
    if len(raw) % dtype.itemsize:
        raise bad_request(f"{where}: {len(raw)} bytes are not whole {dtype.name} values")
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype)
    if not shape:
        return array
    if math.prod(shape) != array.size:
        raise bad_request(f"{where}: {array.size} values do not fill shape {shape}")
    return array.reshape(shape)


def _dense_from_csr(csr: pb.SparseCsr, dtype: np.dtype, shape: list[int], where: str) -> np.ndarray:
    if len(shape) != 2:
        raise bad_request(f"{where}: a sparse tensor needs a 2-dimensional shape, not {shape}")
    if len(csr.values) % dtype.itemsize or len(csr.crow_indices) % 8 or len(csr.col_indices) % 8:
        raise bad_request(f"{where}: sparse buffers are not whole values")
    values = np.frombuffer(csr.values, dtype=dtype.newbyteorder("<")).astype(dtype)
    crow = np.frombuffer(csr.crow_indices, dtype="<i8")
    col = np.frombuffer(csr.col_indices, dtype="<i8")
    rows, cols = shape
    if (len(crow) != rows + 1 or crow[0] != 0 or (np.diff(crow) < 0).any() or crow[-1] != len(col)
            or len(col) != len(values) or (col < 0).any() or (col >= cols).any()):
        raise bad_request(f"{where}: inconsistent sparse CSR indices for shape {shape}")
    dense = np.zeros(shape, dtype=dtype)
    row_of = np.repeat(np.arange(rows), np.diff(crow))
    dense[row_of, col] = values
    return dense


def _batched(arrays: list[np.ndarray]) -> pb.BatchedTensor:
    first = arrays[0]
    is_float = np.issubdtype(first.dtype, np.floating)
    dtype = np.dtype("<f4") if is_float else np.dtype("<i8")
    parts = [np.ascontiguousarray(np.atleast_1d(a), dtype=dtype) for a in arrays]
    offsets = np.cumsum([0, *(p.nbytes for p in parts)]).astype("<i8")
    return pb.BatchedTensor(data=b"".join(p.tobytes() for p in parts), offsets=offsets.tobytes(),
                            dtype=pb.DTYPE_FLOAT32 if is_float else pb.DTYPE_INT64,
                            trailing_shape=list(np.atleast_1d(first).shape[1:]))


def _record(outputs: list[dict[str, np.ndarray]], type_tag: str) -> pb.ArrayRecord:
    record = pb.ArrayRecord(type_tag=type_tag, num_datums=len(outputs))
    for name in outputs[0]:
        record.fields[name].CopyFrom(_batched([np.asarray(o[name]) for o in outputs]))
    return record


def encode_forward(result: ForwardResult) -> bytes:
    """A forward pass's outputs as the SDK's ForwardBackwardOutput: one record for the batch when every datum's
    outputs have the same fields, dtypes and trailing shapes, else one record per datum."""
    message = pb.ForwardBackwardOutput(loss_fn_output_type=result.output_type,
                                       metrics={k: float(v) for k, v in result.metrics.items()})
    outputs = [{k: np.asarray(v) for k, v in o.items()} for o in result.outputs]
    if outputs:
        def layout(o: dict[str, np.ndarray]) -> tuple:
            return tuple((k, np.issubdtype(v.dtype, np.floating), np.atleast_1d(v).shape[1:]) for k, v in o.items())
        uniform = all(layout(o) == layout(outputs[0]) for o in outputs)
        groups = [outputs] if uniform else [[o] for o in outputs]
        message.loss_fn_outputs.extend(_record(g, result.output_type) for g in groups)
    return message.SerializeToString()


def _topk(rows: list[list[tuple[int, float]] | None], k: int) -> pb.TopkLogprobs:
    ids = np.full((len(rows), k), EMPTY_TOPK_TOKEN, dtype="<i4")
    logprobs = np.full((len(rows), k), EMPTY_TOPK_LOGPROB, dtype="<f4")
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate((row or [])[:k]):
            ids[i, j], logprobs[i, j] = token, logprob
    return pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=logprobs.tobytes(), k=k, length=len(rows))


def encode_sample(sequences: list[SampledSequence], prompt_logprobs: list[float | None] | None = None,
                  topk: list[list[tuple[int, float]] | None] | None = None, k: int = 0) -> bytes:
    """Sampled sequences (and the prompt's log-probs, None where there is none: NaN on the wire) as the SDK's
    SampleResponse."""
    message = pb.SampleResponse()
    for seq in sequences:
        message.sequences.add(stop_reason=_STOP[seq.stop_reason],
                              tokens=np.asarray(seq.tokens, dtype="<i4").tobytes(),
                              logprobs=np.asarray(seq.logprobs, dtype="<f4").tobytes())
    if prompt_logprobs is not None:
        values = [math.nan if v is None else v for v in prompt_logprobs]
        message.prompt_logprobs = np.asarray(values, dtype="<f4").tobytes()
    if topk is not None and k > 0:
        message.topk_prompt_logprobs.CopyFrom(_topk(topk, k))
    return message.SerializeToString()
