"""``python -m forge.cache``: the same as ``forge-cache``."""

from forge.cache.cli import cache
from forge.cli.common import entry_point

if __name__ == "__main__":
    entry_point(cache, "cache")()
