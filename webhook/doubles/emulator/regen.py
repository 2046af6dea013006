"""Regenerate kubeproto_pb2.py from kubeproto.proto with grpcio-tools (a dev dependency).

    python -m webhook.doubles.emulator.regen          # rewrites the committed module
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the directory holding the `webhook` package
PROTO = "webhook/doubles/emulator/kubeproto.proto"
OUTPUT = "webhook/doubles/emulator/kubeproto_pb2.py"


def regenerate(out_dir: Path = ROOT) -> Path:
    """Run protoc with the repo root as include path (so the generated names are absolute)."""
    # a dev dependency, not needed at runtime; untyped
    from grpc_tools import protoc  # type: ignore[import-untyped]  # noqa: PLC0415

    code = protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"--python_out={out_dir}",
                        str(ROOT / PROTO)])
    if code != 0:
        raise RuntimeError(f"protoc failed with exit status {code}")
    return out_dir / OUTPUT


if __name__ == "__main__":
    print(regenerate(), file=sys.stderr)
