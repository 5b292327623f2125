"""Writing a pool's calls out as data, one row per call (``forge.pool.browse.call_row``): JSON Lines or Parquet,
readable by pandas and by ``datasets.load_dataset("parquet", data_files=...)``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

FORMATS = ("jsonl", "parquet")
ROWS_PER_GROUP = 1024          # Parquet row group: bounded memory whatever the pool's size

Progress = Callable[[int], None]      # called with the number of sessions done since the last call


def parquet_schema(with_text: bool) -> Any:
    import pyarrow as pa

    columns = [
        ("session_id", pa.string()), ("call_index", pa.int32()), ("group_id", pa.string()),
        ("task_id", pa.string()), ("domain", pa.string()), ("queue_position", pa.uint64()),
        ("status", pa.string()), ("reward", pa.float64()), ("outcome_rewards", pa.string()),
        ("process_rewards", pa.list_(pa.float64())), ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())), ("logprobs", pa.list_(pa.float32())),
        ("weight_versions", pa.list_(pa.int64())), ("actor", pa.string()), ("finish_reason", pa.string()),
        ("created_at", pa.float64()),
    ]
    if with_text:
        columns += [("prompt_text", pa.string()), ("completion_text", pa.string())]
    return pa.schema(columns)


def write_jsonl(rows: Iterable[dict[str, Any]], out: IO[str]) -> int:
    count = 0
    for row in rows:
        out.write(json.dumps(row, separators=(",", ":"), allow_nan=False) + "\n")
        count += 1
    return count


def write_parquet(rows: Iterable[dict[str, Any]], path: Path, with_text: bool) -> int:
    """Rows to a Parquet file, a row group at a time; the file appears whole (written beside it, then renamed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema(with_text)
    partial = path.with_name(f".{path.name}.partial")
    count, batch = 0, []
    try:
        with pq.ParquetWriter(partial, schema) as writer:
            for row in rows:
                batch.append(row)
                if len(batch) == ROWS_PER_GROUP:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                    count, batch = count + len(batch), []
            if batch or not count:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return count
