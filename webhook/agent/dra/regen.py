"""Regenerate the gRPC modules of the kubelet's plugin registration and DRA APIs from the two
.proto files here, with grpcio-tools (a dev dependency), as webhook.agent.deviceplugin.regen does.

    python -m webhook.agent.dra.regen          # rewrites the committed modules
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the directory holding the `webhook` package
PROTOS = ("webhook/agent/dra/pluginregistration.proto", "webhook/agent/dra/dra.proto")
OUTPUTS = tuple(p.removesuffix(".proto") + suffix for p in PROTOS
                for suffix in ("_pb2.py", "_pb2_grpc.py"))


def regenerate(out_dir: Path = ROOT) -> list[Path]:
    """Run protoc with the repo root as include path (so the generated imports are absolute)."""
    # a dev dependency, not needed at runtime; untyped
    from grpc_tools import protoc  # type: ignore[import-untyped]  # noqa: PLC0415

    code = protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"--python_out={out_dir}",
                        f"--grpc_python_out={out_dir}", *(str(ROOT / p) for p in PROTOS)])
    if code != 0:
        raise RuntimeError(f"protoc failed with exit status {code}")
    return [out_dir / p for p in OUTPUTS]


if __name__ == "__main__":
    for path in regenerate():
        sys.stdout.write(f"wrote {path}\n")
