"""Regenerate the committed gRPC modules (`*_pb2.py`, `*_pb2_grpc.py`) from our own .proto files
with grpcio-tools (a dev dependency); each API's `regen` module names its files.

The generated code pins its runtime: protobuf >= the "Protobuf Python Version" in the _pb2
modules and grpcio >= GRPC_GENERATED_VERSION in the _pb2_grpc ones; pyproject.toml's lower
bounds follow them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the directory holding the `webhook` package


def outputs(protos: Sequence[str]) -> tuple[str, ...]:
    """The modules protoc writes for `protos` (paths relative to ROOT)."""
    return tuple(p.removesuffix(".proto") + suffix for p in protos
                 for suffix in ("_pb2.py", "_pb2_grpc.py"))


def regenerate(protos: Sequence[str], out_dir: Path = ROOT) -> list[Path]:
    """Run protoc with the repo root as include path (so the generated imports are absolute)."""
    # a dev dependency, not needed at runtime; untyped
    from grpc_tools import protoc  # type: ignore[import-untyped]  # noqa: PLC0415

    code = protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"--python_out={out_dir}",
                        f"--grpc_python_out={out_dir}", *(str(ROOT / p) for p in protos)])
    if code != 0:
        raise RuntimeError(f"protoc failed with exit status {code}")
    return [out_dir / p for p in outputs(protos)]


def main(protos: Sequence[str]) -> None:
    for path in regenerate(protos):
        sys.stdout.write(f"wrote {path}\n")
