"""`python -m webhook.doubles.emulator` as a process: kubeconfig written, CRDs and seeds loaded,
URL on the first line of stdout, clean exit on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from webhook.kube import MPIJOBS, NODES, KubeApi, make_api_client

NODE = """\
apiVersion: v1
kind: Node
metadata:
  name: dgx-1
  labels: {muster.io/gpu-topology: enabled}
"""


async def test_runs_as_a_process(tmp_path: Path, shared_dir: Path) -> None:
    seed = tmp_path / "nodes.yaml"
    seed.write_text(NODE)
    kubeconfig = tmp_path / "kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "webhook.doubles.emulator", "--kubeconfig", str(kubeconfig),
        "--crds", str(shared_dir / "crds"), "--seed", str(seed),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        assert url.startswith("http://127.0.0.1:")
        client = await make_api_client(str(kubeconfig))
        try:
            kube = KubeApi(client)
            nodes = await kube.list(NODES, label_selector="muster.io/gpu-topology=enabled")
            assert [n["metadata"]["name"] for n in nodes["items"]] == ["dgx-1"]
            assert (await kube.list(MPIJOBS, "default"))["items"] == []
        finally:
            await client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 30)
    assert rc == 0
