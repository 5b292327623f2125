"""Short human forms of figures: numbers, fractions, bytes, durations, sparklines."""

from __future__ import annotations

import math
from collections.abc import Sequence

BARS = "▁▂▃▄▅▆▇█"


def number(value: float | None) -> str:
    """Integers as integers, others with three significant digits, large ones with k/M/G."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    magnitude = abs(value)
    for limit, scale, suffix in ((1e12, 1e12, "T"), (1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if magnitude >= limit:
            return f"{value / scale:.3g}{suffix}"
    if float(value).is_integer():
        return str(int(value))
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if magnitude >= 0.001 else f"{value:.2e}"


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def size(count: float | None) -> str:
    if count is None:
        return "-"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


def used_of(used: float, total: float) -> str:
    """e.g. ``40.1/139.8 GiB``."""
    unit, scale = next(((u, s) for u, s in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)) if total >= s),
                       ("B", 1))
    return f"{used / scale:.1f}/{total / scale:.1f} {unit}"


def duration(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours < 48 else f"{hours // 24}d{hours % 24:02d}h"


def sparkline(values: Sequence[float], width: int = 16) -> str:
    """The last ``width`` values as block characters scaled between their minimum and maximum."""
    points = [v for v in values[-width:] if not math.isnan(v) and not math.isinf(v)]
    if not points:
        return ""
    low, high = min(points), max(points)
    if high == low:
        return BARS[0 if high == 0 else len(BARS) // 2] * len(points)
    return "".join(BARS[min(len(BARS) - 1, int((v - low) / (high - low) * len(BARS)))] for v in points)
