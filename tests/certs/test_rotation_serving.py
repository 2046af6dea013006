"""A rotation with the webhook serving throughout: the emulator calls the webhook over HTTPS as
kube-apiserver does (verifying it with the configuration's caBundle and the Service's DNS name),
pods are created non-stop, and the manager rotates CA and serving certificate meanwhile. The
webhook serves through the admission server's own CertReloader, fed from the Secret the way the
kubelet projects a Secret volume (later than the API change)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from webhook.admission.metrics import Metrics
from webhook.admission.tls import CertReloader
from webhook.certs import pki
from webhook.certs.manager import SelfCertConfig, SelfCertManager
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import MUTATING_WEBHOOKS, NAMESPACES, PODS, SECRETS, KubeApi

NS, SVC, CONFIG = "muster-system", "muster-webhook", "0-muster"
DAY = dt.timedelta(days=1)


def _mutating() -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [{
            "name": "pods.muster.io", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": NS, "name": SVC, "path": "/mutate/pods",
                                         "port": 443}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
            # Ignore, as the chart ships it: a TLS failure would silently skip the mutation,
            # so every pod is checked for the annotation below
            "failurePolicy": "Ignore", "sideEffects": "NoneOnDryRun", "timeoutSeconds": 5,
        }],
    }


async def _answer(request: web.Request) -> web.Response:
    review = await request.json()
    patch = [{"op": "add", "path": "/metadata/annotations",
              "value": {"muster.io/policy": "rotation-test"}}]
    return web.json_response({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
                     "patch": base64.b64encode(json.dumps(patch).encode()).decode()}})


async def _project(kube: KubeApi, cert: Path, key: Path) -> bytes:
    """What the kubelet does with the Secret volume: write the current tls.crt/tls.key."""
    secret = await kube.get(SECRETS, f"{SVC}-tls", NS)
    pair = pki.KeyPair(base64.b64decode(secret["data"]["tls.crt"]),
                       base64.b64decode(secret["data"]["tls.key"]))
    pki.write_pair(pair, cert, key)
    return pair.cert_pem


async def _served_certificate(port: int) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return ssl.DER_cert_to_PEM_cert(der).encode()


async def _verified_handshake(port: int, bundle: bytes) -> None:
    ctx = ssl.create_default_context(cadata=bundle.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                              server_hostname=f"{SVC}.{NS}.svc")
    writer.close()


async def test_rotation_with_the_webhook_serving_throughout(
    apiserver: ApiServerEmulator, kube: KubeApi, tmp_path: Path
) -> None:
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": NS}})
    await kube.create(MUTATING_WEBHOOKS, _mutating())
    # real TLS checks real time: start the story 8.5 days ago, so that "now" is near expiry
    # (CA 1.5 days left < 2 x rotate_before; serving certificate 0.5 days left < rotate_before)
    real_now = dt.datetime.now(dt.UTC)
    clock_now = real_now - 8.5 * DAY
    cfg = SelfCertConfig.for_service(SVC, NS, mutating_webhook_configurations=(CONFIG,),
                                     ca_days=10, cert_days=9, rotate_before=DAY)
    manager = SelfCertManager(kube, cfg, clock=lambda: clock_now)
    await manager.reconcile_once()
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    old_leaf = await _project(kube, cert_file, key_file)
    old_ca = base64.b64decode((await kube.get(SECRETS, f"{SVC}-ca", NS))["data"]["ca.crt"])

    reloader = CertReloader(cert_file, key_file, Metrics())
    app = web.Application()
    app.router.add_post("/mutate/pods", _answer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
    await site.start()
    port = runner.addresses[0][1]
    apiserver.service_hosts[(NS, SVC)] = f"127.0.0.1:{port}"

    phase = "before"
    created: list[tuple[str, dict[str, Any]]] = []
    stop = asyncio.Event()
    progress = asyncio.Condition()

    async def create_pods() -> None:
        while not stop.is_set():
            pod = await kube.create(PODS, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "w-"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}, "team-a")
            created.append((phase, pod))
            async with progress:
                progress.notify_all()
            await asyncio.sleep(0.005)

    async def until(count: int) -> None:
        """Let `count` more pods go through, then check a new connection as the API server
        would open it now: with the caBundle the configuration holds at this moment."""
        target = len(created) + count
        async with progress:
            await progress.wait_for(lambda: len(created) >= target)
        config = await kube.get(MUTATING_WEBHOOKS, CONFIG)
        bundle = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
        await _verified_handshake(port, bundle)

    loader = asyncio.create_task(create_pods())
    try:
        await until(10)
        # rotation in the API: new CA into the caBundle (next to the old), new serving cert
        clock_now = real_now
        phase = "rotated-in-api"
        result = await manager.reconcile_once()
        assert result.ca_rotated and result.cert_issued and result.trusted_cas == 2
        await until(10)  # the pods still reach the old certificate: the old CA is trusted
        assert await _served_certificate(port) == old_leaf
        # the kubelet catches up; the server swaps the pair in place
        new_leaf = await _project(kube, cert_file, key_file)
        assert reloader.check()
        phase = "reloaded"
        await until(10)
        served = await _served_certificate(port)
        assert served == new_leaf != old_leaf
        assert not pki.signed_by(served, old_ca)
    finally:
        stop.set()
        await loader

    try:
        assert {p for p, _ in created} >= {"before", "rotated-in-api", "reloaded"}
        unmutated = [pod["metadata"]["name"] for _, pod in created
                     if (pod["metadata"].get("annotations") or {}).get("muster.io/policy")
                     != "rotation-test"]
        assert unmutated == [], f"{len(unmutated)} of {len(created)} pods missed the webhook"
        errors = [c.error for c in apiserver.webhook_calls if c.error]
        assert errors == []
        assert len(apiserver.webhook_calls) >= len(created)

        # control: a caBundle without the serving certificate's CA does fail (so the checks
        # above can fail), and failurePolicy Ignore lets the pod through unmutated
        stranger = pki.generate_ca("stranger", 1).cert_pem
        with pytest.raises(ssl.SSLCertVerificationError):
            await _verified_handshake(port, stranger)
        config = await kube.get(MUTATING_WEBHOOKS, CONFIG)
        config["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(stranger).decode()
        await kube.replace(MUTATING_WEBHOOKS, CONFIG, config)
        pod = await kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "w-"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}, "team-a")
        assert "muster.io/policy" not in (pod["metadata"].get("annotations") or {})
        assert apiserver.webhook_calls[-1].error
        assert "certificate" in apiserver.webhook_calls[-1].error.lower()
    finally:
        await runner.cleanup()
