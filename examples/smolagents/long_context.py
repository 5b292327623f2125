"""Writes the built-in tiny model with a longer context (16,384 positions, RoPE unchanged) beside this file, in
tiny-16k/: smolagents' default system prompt alone is longer than the tiny model's 2,048 tokens. A real checkpoint
needs none of this. Run it once with Forge's Python: .venv/bin/python examples/smolagents/long_context.py [OUT]"""

import json
import shutil
import sys
from pathlib import Path

from forge.assets import TINY_DIR

CONTEXT = 16384


def write(out: Path) -> Path:
    shutil.copytree(TINY_DIR, out, dirs_exist_ok=True)
    config = json.loads((out / "config.json").read_text())
    config["max_position_embeddings"] = CONTEXT
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "tiny-16k"))
