"""Regenerate api_pb2.py / api_pb2_grpc.py from api.proto (webhook.agent.protoc).

    python -m webhook.agent.podresources.regen          # rewrites the committed modules
"""

from __future__ import annotations

from pathlib import Path

from webhook.agent import protoc
from webhook.agent.protoc import ROOT

__all__ = ["OUTPUTS", "ROOT", "regenerate"]

PROTOS = ("webhook/agent/podresources/api.proto",)
OUTPUTS = protoc.outputs(PROTOS)


def regenerate(out_dir: Path = ROOT) -> list[Path]:
    return protoc.regenerate(PROTOS, out_dir)


if __name__ == "__main__":
    protoc.main(PROTOS)
