"""The workloads of the multi-node tier that need no image but Muster's: ranks that find each
other by DNS and exchange numbers over TCP, or hold their GPUs until deleted."""

from __future__ import annotations

from typing import Any

from e2e.node import image
from webhook import keys

#: rank 0 adds every rank's number (rank + 1) and sends the sum back; each prints one JSON line
EXCHANGE = """
import json, os, socket, time
rank, world = int(os.environ["JOB_COMPLETION_INDEX"]), int(os.environ["WORLD"])
line = {"rank": rank, "node": os.environ["NODE_NAME"], "host": socket.gethostname(),
        "visible": os.environ.get("NVIDIA_VISIBLE_DEVICES", "")}
if rank == 0:
    server = socket.create_server(("", 29500))
    peers = [server.accept()[0] for _ in range(world - 1)]
    total = 1 + sum(int(p.recv(64)) for p in peers)
    for p in peers:
        p.sendall(str(total).encode())
else:
    master = os.environ["MASTER"]
    for _ in range(600):
        try:
            conn = socket.create_connection((master, 29500), timeout=5)
            break
        except OSError:
            time.sleep(0.2)
    conn.sendall(str(rank + 1).encode())
    total = int(conn.recv(64))
print(json.dumps({**line, "sum": total}), flush=True)
"""


#: each rank prints its line, then runs until deleted
HOLD = """
import json, os, socket, time
print(json.dumps({"rank": int(os.environ["JOB_COMPLETION_INDEX"]), "node": os.environ["NODE_NAME"],
                  "visible": os.environ.get("NVIDIA_VISIBLE_DEVICES", "")}), flush=True)
time.sleep(3600)
"""
#: a pod on a node that stops answering is evicted after this long (300 s by default)
FAST_FAILOVER = [{"key": f"node.kubernetes.io/{taint}", "operator": "Exists",
                  "effect": "NoExecute", "tolerationSeconds": 2}
                 for taint in ("unreachable", "not-ready")]


def indexed_job(ns: str, name: str, world: int, gpus: int, program: str, *,
                backoff_limit: int = 0) -> list[dict[str, Any]]:
    """A headless Service and an Indexed Job of `world` pods of `gpus` GPUs each running
    `program` in the Muster image, rank 0 reachable as `<name>-0.<name>`."""
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"clusterIP": "None", "selector": {"job-name": name},
                        "ports": [{"port": 29500}]}}
    container = {
        "name": "rank", "image": f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}",
        "imagePullPolicy": "Never", "command": ["python", "-c", program],
        "env": [{"name": "WORLD", "value": str(world)},
                {"name": "MASTER", "value": f"{name}-0.{name}"},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                      "limits": {keys.GPU_RESOURCE: str(gpus)}}}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"completionMode": "Indexed", "completions": world, "parallelism": world,
                    "backoffLimit": backoff_limit,
                    "template": {"spec": {"subdomain": name, "restartPolicy": "Never",
                                          "terminationGracePeriodSeconds": 1,
                                          "tolerations": FAST_FAILOVER,
                                          "containers": [container]}}}}
    return [service, job]
