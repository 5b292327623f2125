"""The records of an offline W&B run, read back from its .wandb file: a LevelDB-style log (a 7-byte W&B header, then
32 KiB blocks of records, each with a 7-byte header and split across blocks when long) of wandb's Record protos."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER = 7                  # ":W&B", magic, version
BLOCK = 32 * 1024
RECORD_HEADER = 7           # crc32, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    found, pending, offset = [], b"", HEADER
    while offset + RECORD_HEADER <= len(data):
        left = BLOCK - offset % BLOCK
        if left < RECORD_HEADER:                # the block's tail is padding
            offset += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset:offset + RECORD_HEADER])
        payload = data[offset + RECORD_HEADER:offset + RECORD_HEADER + length]
        offset += RECORD_HEADER + length
        if kind in (FULL, FIRST):
            pending = payload
        elif kind in (MIDDLE, LAST):
            pending += payload
        else:
            break                                   # zeros: the end of what was written
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
    return found


def history(path: Path) -> list[dict[str, Any]]:
    """The rows the run logged (``run.log``), their values decoded from JSON; a nested key as its parts joined by
    slashes (a table: ``samples/_type``)."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def config(path: Path) -> dict[str, Any]:
    """The run's config as its last config record left it."""
    found: dict[str, Any] = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "config":
            for item in record.config.update:
                found[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return found
