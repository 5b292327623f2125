"""Rebuild the built-in tokenizer of the tiny model (forge/assets/tiny) from forge.app.tiny_tokenizer."""

import sys
from pathlib import Path

from forge.app.tiny_tokenizer import ASSET_DIR, build

if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ASSET_DIR
    for path in build(out):
        print(path)
