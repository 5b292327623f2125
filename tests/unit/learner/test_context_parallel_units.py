"""Context parallelism's shares of a tree: every token computed by exactly one rank, and the attention work of a
long causal chain balanced across the group. (The sharded step against one rank's: integration/
test_context_parallel.py.)"""

from __future__ import annotations

import pytest
import torch

from forge.learner.context_parallel import shard_rows


@pytest.mark.parametrize("count", [0, 1, 5, 64, 1000, 4097])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_every_row_goes_to_exactly_one_rank_in_order(count, size):
    shares = shard_rows(count, size)
    assert len(shares) == size
    assert all(torch.equal(share, share.sort().values) for share in shares)
    assert torch.equal(torch.cat(shares).sort().values, torch.arange(count))
    assert max(s.numel() for s in shares) - min(s.numel() for s in shares) <= 2


@pytest.mark.parametrize("size", [2, 4, 8])
def test_zig_zag_shares_balance_a_causal_chain_s_attention(size):
    """On a chain (every token sees all before it) a rank's attention work is the sum of its rows' positions:
    contiguous shares would give the last rank 2·size − 1 times the first's; zig-zag ones stay within 1 %."""
    count = 65536
    work = [float((share + 1).sum()) for share in shard_rows(count, size)]
    assert max(work) / min(work) < 1.01
    contiguous = [float((torch.arange(count * r // size, count * (r + 1) // size) + 1).sum()) for r in range(size)]
    assert max(contiguous) / min(contiguous) > 2 * size - 1.5
