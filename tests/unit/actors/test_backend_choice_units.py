"""The vLLM backend's routed experts become the records' sparse layers (a pure function: vLLM need not be installed)."""

from __future__ import annotations

import pytest


def test_vllms_routed_experts_become_the_records_sparse_layers_with_unsent_positions_unknown():
    """vLLM returns a row for every decoder layer; the record keeps the sparse ones, in order, over the positions
    the request fed (-1 past the rows vLLM sent)."""
    import numpy as np

    from forge.actors.vllm.outputs import routing_of_rows

    rows = np.random.default_rng(0).integers(0, 8, size=(5, 4, 2), dtype=np.int16)
    record = routing_of_rows(rows, 7, (1, 3), 8)
    assert record.ids.dtype == np.int32 and record.ids.shape == (7, 2, 2) and record.num_experts == 8
    assert (record.ids[:5, 0] == rows[:, 1]).all() and (record.ids[:5, 1] == rows[:, 3]).all()
    assert (record.ids[5:] == -1).all()
    assert routing_of_rows(rows, 3, (0, 1, 2, 3), 8).ids.tolist() == rows[:3].tolist()
    with pytest.raises(ValueError, match="not \\[positions, layers, top_k\\]"):
        routing_of_rows(rows[0], 3, (0,), 8)
    with pytest.raises(ValueError, match="cover 4 layers"):
        routing_of_rows(rows, 3, (4,), 8)
