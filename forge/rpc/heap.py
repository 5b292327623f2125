"""The garbage collector of a long-running service. A service builds a large, long-lived heap as it starts (modules,
classes, functions, its model and tokenizer tables: hundreds of thousands of objects) and then serves calls that make
many short-lived containers. Python's collector would scan that start-up heap again at every full collection, which
a steady stream of calls triggers over and over; and it collects the youngest objects every 700 allocations, most of
which reference counting frees moments later anyway.

``settle()``, called once a service serves, moves everything alive into the collector's permanent generation
(``gc.freeze``: never scanned again) and collects the young generation less often. Cyclic garbage is still collected;
objects frozen at start that later become cyclic garbage are not (a service's start-up objects live as long as it)."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000        # allocations between collections of the youngest generation (Python's default: 700)


def settle() -> None:
    """Freeze the heap built so far and collect the youngest generation every ``YOUNG_THRESHOLD`` allocations."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
