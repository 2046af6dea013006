"""`helm install`, `upgrade`, `rollback` and `uninstall` with the real helm binary against the API
server emulator: an upgrade changes what the values say and loses nothing else, above all the
caBundle the certificate manager wrote into the webhook configurations (docs/operations.md).

Helm runs with `--server-side=false` (its client-side three-way merge, the only mode Helm 3
has; the emulator has no server-side apply) and `--no-hooks` (the emulator runs no Jobs): the
certificate hook's own command is run here instead, with the hook Job's arguments.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from chart_helpers import CHART, NAMESPACE, run_cert_hook, run_helm, values_args

from webhook.doubles.emulator import ApiServerEmulator

RELEASE = "muster"
CONFIG = "0-muster"  # both webhook configurations
POLICY = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {{name: {name}}}
spec:
  match: {{namespaces: [{name}]}}
  gang: {{backend: volcano, minAvailable: auto}}
"""


async def _helm(*args: str) -> dict[str, Any] | None:
    proc = await asyncio.to_thread(run_helm, *args)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}"
    return json.loads(proc.stdout) if "--output" in args else None


def _ca_bundles(api: ApiServerEmulator) -> list[str]:
    return [w["clientConfig"].get("caBundle", "")
            for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
            for w in api.get(kind, CONFIG)["webhooks"]]  # type: ignore[index]


def _timeout(api: ApiServerEmulator) -> int:
    hook = api.get("mutatingwebhookconfigurations", CONFIG)
    assert hook is not None
    return int(hook["webhooks"][0]["timeoutSeconds"])


async def test_upgrade_and_rollback_keep_certificates(
        apiserver: ApiServerEmulator, tmp_path: Path, helm_template: Any) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    common = ["--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig), "--server-side=false",
              "--no-hooks"]
    first = {"policies": {"team-a.yaml": POLICY.format(name="team-a")}}
    await _helm("install", RELEASE, str(CHART), "--create-namespace", *common,
                *values_args(tmp_path, first))
    assert _ca_bundles(apiserver) == ["", ""]  # the chart never templates it in self mode
    await run_cert_hook(helm_template(first), kubeconfig)
    bundles = _ca_bundles(apiserver)
    assert all(bundles) and len(set(bundles)) == 1
    secrets = {n: apiserver.get("secrets", n, namespace=NAMESPACE)
               for n in ("muster-webhook-ca", "muster-webhook-tls")}
    assert all(secrets.values())

    # new values: one more policy, a longer webhook timeout
    second = {"policies": {**first["policies"], "team-b.yaml": POLICY.format(name="team-b")},
              "webhook": {"timeoutSeconds": 7}}
    await _helm("upgrade", RELEASE, str(CHART), *common, *values_args(tmp_path, second))
    assert _timeout(apiserver) == 7
    configmap = apiserver.get("configmaps", "muster-policies", namespace=NAMESPACE)
    assert configmap is not None and {"team-a.yaml", "team-b.yaml"} <= set(configmap["data"])
    assert _ca_bundles(apiserver) == bundles  # written by the manager, kept by the upgrade
    for name, before in secrets.items():  # not Helm's: untouched
        assert apiserver.get("secrets", name, namespace=NAMESPACE) == before
    (release,) = await _helm("list", "--namespace", NAMESPACE, "--kubeconfig",  # type: ignore[misc]
                             str(kubeconfig), "--output", "json")
    assert (release["revision"], release["status"]) == ("2", "deployed")

    await _helm("rollback", RELEASE, "1", *common)
    assert _timeout(apiserver) == 5
    configmap = apiserver.get("configmaps", "muster-policies", namespace=NAMESPACE)
    assert configmap is not None and "team-b.yaml" not in configmap["data"]
    assert _ca_bundles(apiserver) == bundles

    await _helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig),
                "--no-hooks")
    assert apiserver.get("mutatingwebhookconfigurations", CONFIG) is None
    assert apiserver.get("configmaps", "muster-policies", namespace=NAMESPACE) is None
    assert apiserver.objects("deployments", NAMESPACE) == []
    # --no-hooks: the post-delete hook that removes them did not run (it does in tests/real)
    assert all(apiserver.get("secrets", n, namespace=NAMESPACE) for n in secrets)
