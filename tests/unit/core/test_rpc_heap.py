"""A serving process's collector (``forge.rpc.heap``): settling freezes the start-up heap and collects the youngest
generation less often, and cyclic garbage made afterwards is still collected by the collector's own runs."""

from __future__ import annotations

import gc
import weakref

from forge.rpc import heap


class Node:
    pass


def test_settle_freezes_the_heap_and_still_collects_new_cycles():
    threshold = gc.get_threshold()
    try:
        heap.settle()
        assert gc.get_freeze_count() > 1000 and gc.get_threshold()[0] == heap.YOUNG_THRESHOLD
        cycle = Node()
        cycle.itself = cycle
        alive = weakref.ref(cycle)
        del cycle
        held = [[] for _ in range(2 * heap.YOUNG_THRESHOLD)]     # enough allocations for a young collection
        assert alive() is None and len(held) == 2 * heap.YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
