"""`helm test` for real, minus the kubelet: the chart's rendered webhook configurations and
policies, `muster certs ensure` run with the hook Job's own arguments, the real admission server
serving the projected Secret, and the helm test pod's script run as a process against the API
server emulator over TLS (as in a pod: service account token and CA files, KUBERNETES_SERVICE_*).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import pytest

from webhook.demo import EXAMPLE_POLICIES

sys.path.insert(0, str(Path(__file__).parent))

from chart_helpers import NAMESPACE, Obj, hook, one, run_cert_hook

from webhook.admission.server import ServeOptions, WebhookServer
from webhook.certs import pki
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import NAMESPACES, PODS, SECRETS, ApiError, KubeApi, make_api_client

Render = Callable[..., list[Obj]]
SA = "/var/run/secrets/kubernetes.io/serviceaccount"


async def _run_test_pod(pod: Obj, api: ApiServerEmulator, ca_pem: bytes,
                        tmp: Path) -> tuple[int, str]:
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    sa = tmp / "sa"
    sa.mkdir()
    (sa / "token").write_text("helm-test-token")
    (sa / "ca.crt").write_bytes(ca_pem)
    script = container["args"][0].replace(SA, str(sa))
    for name, value in env.items():  # the kubelet expands $(VAR) in args
        script = script.replace(f"$({name})", value)
    proc = await asyncio.create_subprocess_exec(
        *container["command"], script, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **env, "KUBERNETES_SERVICE_HOST": api.host,
             "KUBERNETES_SERVICE_PORT": str(api.port)})
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def _wait_ready(port: int) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            async with session.get(f"https://127.0.0.1:{port}/readyz", ssl=ctx) as resp:
                if resp.status == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError("the webhook server never became ready")


class _Install(NamedTuple):
    api: ApiServerEmulator
    kube: KubeApi
    server: WebhookServer
    ca_pem: bytes  # the emulator's CA, which a pod's service account trusts


@contextlib.asynccontextmanager
async def _installed(objs: list[Obj], crds: list[dict[str, Any]], tmp_path: Path
                     ) -> AsyncIterator[_Install]:
    """The rendered chart on the API server emulator (TLS): its webhook configurations, its
    certificate hook run, and the real admission server serving the Secret and the policies as
    the Deployment mounts them, behind the webhook Service."""
    api_ca = pki.generate_ca("emulator-ca", 1)
    api_tls = pki.issue_serving_cert(api_ca, ["localhost"], ["127.0.0.1"], 1)
    pki.write_pair(api_tls, tmp_path / "api.crt", tmp_path / "api.key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "api.crt", tmp_path / "api.key")
    api = ApiServerEmulator(ssl_context=ctx, ca_pem=api_ca.cert_pem, crds=crds)
    async with api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        client = await make_api_client(str(kubeconfig))
        kube = KubeApi(client)
        server: WebhookServer | None = None
        try:
            await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": NAMESPACE}})
            for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                api.seed(one(objs, kind))

            await run_cert_hook(objs, kubeconfig)  # the pre/post-install hook Job

            # the kubelet: Secret and ConfigMap volumes as the Deployment mounts them
            tls = await kube.get(SECRETS, "muster-webhook-tls", NAMESPACE)
            files = tmp_path / "tls"
            pki.write_pair(pki.KeyPair(base64.b64decode(tls["data"]["tls.crt"]),
                                       base64.b64decode(tls["data"]["tls.key"])),
                           files / "tls.crt", files / "tls.key")
            policies = tmp_path / "policies"
            policies.mkdir()
            for name, text in one(objs, "ConfigMap", "muster-policies")["data"].items():
                (policies / name).write_text(text)

            server = WebhookServer(ServeOptions(
                policies=[policies], host="127.0.0.1", port=0,
                tls_cert_file=files / "tls.crt", tls_key_file=files / "tls.key",
                kubeconfig=str(kubeconfig), namespace=NAMESPACE,
                service_name="muster-webhook", policies_configmap="muster-policies"))
            await server.start()
            api.service_hosts[(NAMESPACE, "muster-webhook")] = f"127.0.0.1:{server.port}"
            await _wait_ready(server.port)
            yield _Install(api, kube, server, api_ca.cert_pem)
        finally:
            if server is not None:
                await server.stop()
            await client.close()


@pytest.mark.parametrize("selftest", [True, False])
async def test_helm_test_passes_only_when_the_webhook_applies_a_policy(
    helm_template: Render, shared_crds: list[dict[str, Any]], tmp_path: Path, selftest: bool
) -> None:
    shipped = {p.name: p.read_text() for p in sorted(EXAMPLE_POLICIES.glob("*.yaml"))}
    objs = helm_template({"policies": shipped, "tests": {"selftestPolicy": selftest}})
    async with _installed(objs, shared_crds, tmp_path) as (api, _, _, ca_pem):
        (test_pod,) = [o for o in objs if o["kind"] == "Pod" and hook(o) == "test"]
        rc, out = await _run_test_pod(test_pod, api, ca_pem, tmp_path)

    calls = [c for c in api.webhook_calls if c.webhook == "pods.muster.io"]
    assert calls and all(c.error is None for c in calls), [c.error for c in calls]
    assert calls[-1].request["request"]["dryRun"] is True
    assert api.objects("pods", "default") == []  # dry run: nothing persisted
    if selftest:
        assert rc == 0, out
        assert "OK: policy muster-selftest applied by the webhook" in out
    else:
        assert rc != 0, out
        assert "FAIL: the dry-run pod has no muster.io/policy annotation" in out


async def test_a_fail_closed_namespace_goes_to_its_own_entry_and_waits_for_the_webhook(
    helm_template: Render, shared_crds: list[dict[str, Any]], tmp_path: Path
) -> None:
    """With webhook.failClosedNamespaceLabel, the labelled namespace's pods are sent to the
    fail-closed entry only, the others' to the default one only; with the webhook stopped the
    labelled namespace's pod is refused and the other's admitted unmutated."""
    label = {"muster.io/admission": "required"}
    objs = helm_template({"webhook": {"failClosedNamespaceLabel": label}})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    async with _installed(objs, shared_crds, tmp_path) as (api, kube, server, _):
        for ns, labels in (("closed", label), ("opened", {})):
            await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": ns, "labels": labels}})
            await kube.create(PODS, pod, ns)
        served = [(c.webhook, c.request["request"]["namespace"], c.error)
                  for c in api.webhook_calls if c.request["request"]["kind"]["kind"] == "Pod"]
        assert served == [("pods-fail-closed.muster.io", "closed", None),
                          ("pods.muster.io", "opened", None)]
        await server.stop()
        with pytest.raises(ApiError) as err:
            await kube.create(PODS, pod, "closed")
        assert 'failed calling webhook "pods-fail-closed.muster.io"' in err.value.message
        await kube.create(PODS, pod, "opened")
    assert len(api.objects("pods", "closed")) == 1 and len(api.objects("pods", "opened")) == 2
