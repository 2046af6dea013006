"""The real kubectl binary against the emulator: discovery, OpenAPI field-validation probe,
client-side apply (create then patch), create conflicts, get with server-side tables, delete.
kubectl runs as a subprocess while the emulator serves on the test's event loop."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from webhook.doubles.emulator import ApiServerEmulator

REPO = Path(__file__).resolve().parents[2]
KUBECTL = REPO / ".cache" / "bin" / "kubectl"
if not KUBECTL.exists() and shutil.which("kubectl"):
    KUBECTL = Path(shutil.which("kubectl") or "kubectl")

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl binary not installed")

MANIFEST = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: muster-policies
  namespace: team-a
data:
  policy.yaml: "{value}"
"""


async def kubectl(kubeconfig: Path, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--kubeconfig", str(kubeconfig), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def test_apply_get_create_delete(apiserver: ApiServerEmulator, kubeconfig: Path,
                                       tmp_path: Path, shared_dir: Path) -> None:
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(MANIFEST.format(value="v1"))
    rc, out = await kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert (rc, out.strip()) == (0, "configmap/muster-policies created")
    manifest.write_text(MANIFEST.format(value="v2"))
    rc, out = await kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert (rc, out.strip()) == (0, "configmap/muster-policies configured")
    stored = apiserver.get("configmaps", "muster-policies", "team-a")
    assert stored is not None and stored["data"] == {"policy.yaml": "v2"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in stored["metadata"]["annotations"]

    rc, out = await kubectl(kubeconfig, "create", "-f", str(manifest))
    assert rc == 1 and 'configmaps "muster-policies" already exists' in out

    job = shared_dir / "fixtures" / "jobs" / "mpijob-vgg16-4workers.yaml"
    rc, out = await kubectl(kubeconfig, "apply", "-n", "team-a", "-f", str(job))
    assert rc == 0 and "mpijob.kubeflow.org/" in out and "created" in out
    rc, out = await kubectl(kubeconfig, "get", "mpijobs", "-n", "team-a", "-o", "json")
    names = [i["metadata"]["name"] for i in json.loads(out)["items"]]
    assert rc == 0 and len(names) == 1
    rc, out = await kubectl(kubeconfig, "get", "mpijobs", "-n", "team-a")
    assert rc == 0 and out.splitlines()[0].split() == ["NAME", "AGE"]
    assert out.splitlines()[1].split()[0] == names[0]

    rc, out = await kubectl(kubeconfig, "delete", "configmap", "muster-policies", "-n", "team-a")
    assert rc == 0 and 'configmap "muster-policies" deleted' in out
    assert apiserver.get("configmaps", "muster-policies", "team-a") is None


async def test_api_resources_lists_crds(kubeconfig: Path) -> None:
    rc, out = await kubectl(kubeconfig, "api-resources", "--api-group=scheduling.volcano.sh")
    assert rc == 0
    rows = {line.split()[0] for line in out.splitlines()[1:]}
    assert rows == {"podgroups", "queues"}


INSTALL = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: muster-binder}
rules: [{apiGroups: [""], resources: [pods/binding], verbs: [create]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: muster-binder, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: muster-binder}
subjects: [{kind: ServiceAccount, name: muster-binder, namespace: team-a}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: muster-agent, namespace: team-a}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: agent, image: muster:dev}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: muster-webhook, namespace: team-a}
spec: {minAvailable: 1, selector: {matchLabels: {app: webhook}}}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: training}
value: 1000
"""


async def test_install_manifests_of_the_chart_kinds(apiserver: ApiServerEmulator,
                                                    kubeconfig: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "install.yaml"
    manifest.write_text(INSTALL)
    rc, out = await kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert rc == 0, out
    assert out.count(" created") == 5
    assert apiserver.get("daemonsets.apps", "muster-agent", "team-a") is not None
    assert apiserver.get("priorityclasses.scheduling.k8s.io", "training") is not None
