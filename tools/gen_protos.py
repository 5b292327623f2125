"""Regenerate the Python stubs of ``protos/forge/v1/*.proto`` (messages, gRPC services and type stubs).

Usage: ``python tools/gen_protos.py [--out DIR]``. The stubs are written beside the .proto files by default, which
is where the package ``forge.v1`` is installed from; ``--out`` writes them elsewhere (the stale-stub test does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent.parent / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / "forge" / "v1").glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Run protoc over every proto file; returns the generated files under ``out_root``."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    include = Path(protoc.__file__).parent / "_proto"
    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    out_dir = out_root / "forge" / "v1"
    return sorted(p for p in out_dir.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT, help="root to write forge/v1/*_pb2*.py under")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path.relative_to(args.out))


if __name__ == "__main__":
    sys.exit(main())
