"""Regenerate api_pb2.py / api_pb2_grpc.py from api.proto with grpcio-tools (a dev dependency).

    python -m webhook.agent.deviceplugin.regen          # rewrites the committed modules

The generated code pins its runtime: protobuf >= the "Protobuf Python Version" in api_pb2.py and
grpcio >= GRPC_GENERATED_VERSION in api_pb2_grpc.py; pyproject.toml's lower bounds follow them.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the directory holding the `webhook` package
PROTO = "webhook/agent/deviceplugin/api.proto"
OUTPUTS = ("webhook/agent/deviceplugin/api_pb2.py", "webhook/agent/deviceplugin/api_pb2_grpc.py")


def regenerate(out_dir: Path = ROOT) -> list[Path]:
    """Run protoc with the repo root as include path (so the generated import is absolute)."""
    # a dev dependency, not needed at runtime; untyped
    from grpc_tools import protoc  # type: ignore[import-untyped]  # noqa: PLC0415

    code = protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"--python_out={out_dir}",
                        f"--grpc_python_out={out_dir}", str(ROOT / PROTO)])
    if code != 0:
        raise RuntimeError(f"protoc failed with exit status {code}")
    return [out_dir / p for p in OUTPUTS]


if __name__ == "__main__":
    for path in regenerate():
        sys.stdout.write(f"wrote {path}\n")
