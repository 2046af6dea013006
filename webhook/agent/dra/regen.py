"""Regenerate the gRPC modules of the kubelet's plugin registration and DRA APIs from the two
.proto files here (webhook.agent.protoc).

    python -m webhook.agent.dra.regen          # rewrites the committed modules
"""

from __future__ import annotations

from pathlib import Path

from webhook.agent import protoc
from webhook.agent.protoc import ROOT

__all__ = ["OUTPUTS", "ROOT", "regenerate"]

PROTOS = ("webhook/agent/dra/pluginregistration.proto", "webhook/agent/dra/dra.proto")
OUTPUTS = protoc.outputs(PROTOS)


def regenerate(out_dir: Path = ROOT) -> list[Path]:
    return protoc.regenerate(PROTOS, out_dir)


if __name__ == "__main__":
    protoc.main(PROTOS)
