"""The `self` certificate manager against the API server emulator, over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
from typing import Any

import pytest

from webhook.certs import pki
from webhook.certs.manager import (
    CA_BUNDLE_KEY,
    CertManagerError,
    SelfCertConfig,
    SelfCertManager,
    remove_webhook_configurations,
)
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import (
    LEASES,
    MUTATING_WEBHOOKS,
    NAMESPACES,
    SECRETS,
    VALIDATING_WEBHOOKS,
    ApiError,
    KubeApi,
)

NS = "muster-system"
SVC = "muster-webhook"
CONFIG = "0-muster"
TLS, CA = f"{SVC}-tls", f"{SVC}-ca"  # the Secrets' default names
DAY = dt.timedelta(days=1)
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def config(**kw: Any) -> SelfCertConfig:
    return SelfCertConfig.for_service(
        SVC, NS, mutating_webhook_configurations=(CONFIG,),
        validating_webhook_configurations=(CONFIG,), **kw)


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def webhook_configurations(port: int = 443) -> list[tuple[Any, dict[str, Any]]]:
    service = {"namespace": NS, "name": SVC, "port": port}
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [{
            "name": "pods.muster.io", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {**service, "path": "/mutate/pods"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
            "failurePolicy": "Ignore", "sideEffects": "NoneOnDryRun", "timeoutSeconds": 5,
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system", NS]}]},
        }],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration", "metadata": {"name": CONFIG},
        "webhooks": [{
            "name": "policies.muster.io", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {**service, "path": "/validate/policies"}},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                       "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "failurePolicy": "Ignore", "sideEffects": "None",
            "objectSelector": {"matchLabels": {"muster.io/policies": "muster"}},
        }],
    }
    return [(MUTATING_WEBHOOKS, mutating), (VALIDATING_WEBHOOKS, validating)]


@pytest.fixture
async def cluster(kube: KubeApi) -> KubeApi:
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": NS}})
    for resource, body in webhook_configurations():
        await kube.create(resource, body)
    return kube


async def secret(kube: KubeApi, name: str) -> dict[str, Any]:
    return await kube.get(SECRETS, name, NS)


def data(obj: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(obj["data"][key])


async def bundles(kube: KubeApi) -> list[bytes]:
    out = []
    for resource in (MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS):
        cfg = await kube.get(resource, CONFIG)
        out += [base64.b64decode(w["clientConfig"]["caBundle"]) for w in cfg["webhooks"]]
    return out


async def assert_consistent(kube: KubeApi) -> tuple[bytes, bytes]:
    """The invariant: every caBundle trusts the serving certificate in the Secret."""
    tls, ca = await secret(kube, f"{SVC}-tls"), await secret(kube, f"{SVC}-ca")
    assert tls["type"] == "kubernetes.io/tls"
    leaf, key = data(tls, "tls.crt"), data(tls, "tls.key")
    assert pki.key_matches(leaf, key)
    trusted = data(ca, CA_BUNDLE_KEY)
    assert data(tls, "ca.crt") == trusted
    assert pki.load_certificates(trusted)[0] == pki.load_certificate(data(ca, "ca.crt"))
    for bundle in await bundles(kube):
        assert bundle == trusted
        assert pki.signed_by(leaf, bundle)
    return leaf, trusted


async def test_creates_secrets_and_patches_ca_bundles(cluster: KubeApi) -> None:
    manager = SelfCertManager(cluster, config(), Clock(T0))
    result = await manager.reconcile_once()
    assert result.ca_created and result.cert_issued and not result.ca_rotated
    assert sorted(result.patched) == [f"mutatingwebhookconfigurations/{CONFIG}",
                                      f"validatingwebhookconfigurations/{CONFIG}"]
    leaf, trusted = await assert_consistent(cluster)
    assert len(pki.load_certificates(trusted)) == 1
    assert f"{SVC}.{NS}.svc" in pki.dns_names(leaf)
    assert pki.not_after(leaf) == T0 + 365 * DAY
    # the webhook rules are untouched: only caBundle was added
    mutating = await cluster.get(MUTATING_WEBHOOKS, CONFIG)
    assert mutating["webhooks"][0]["failurePolicy"] == "Ignore"
    assert mutating["webhooks"][0]["clientConfig"]["service"]["path"] == "/mutate/pods"

    # a second run changes nothing at all
    versions = [(await secret(cluster, n))["metadata"]["resourceVersion"]
                for n in (f"{SVC}-tls", f"{SVC}-ca")]
    again = await manager.reconcile_once()
    assert not (again.ca_created or again.ca_rotated or again.cert_issued or again.patched)
    assert versions == [(await secret(cluster, n))["metadata"]["resourceVersion"]
                        for n in (f"{SVC}-tls", f"{SVC}-ca")]


async def test_missing_configurations_are_reported_not_fatal(kube: KubeApi) -> None:
    """The pre-install hook runs before Helm has created the webhook configurations."""
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": NS}})
    result = await SelfCertManager(kube, config(), Clock(T0)).reconcile_once()
    assert result.cert_issued and result.patched == []
    assert sorted(result.missing) == [f"mutatingwebhookconfigurations/{CONFIG}",
                                      f"validatingwebhookconfigurations/{CONFIG}"]
    for resource, body in webhook_configurations():  # then Helm creates them: post-install hook
        await kube.create(resource, body)
    result = await SelfCertManager(kube, config(), Clock(T0 + DAY)).reconcile_once()
    assert not result.cert_issued and len(result.patched) == 2
    await assert_consistent(kube)


async def test_never_overwrites_a_valid_secret(cluster: KubeApi) -> None:
    await SelfCertManager(cluster, config(), Clock(T0)).reconcile_once()
    before = {n: (await secret(cluster, n))["data"] for n in (f"{SVC}-tls", f"{SVC}-ca")}
    # another replica, later, with other lifetimes: keeps what is valid
    other = config(ca_days=100, cert_days=10, rotate_before=2 * DAY)
    result = await SelfCertManager(cluster, other, Clock(T0 + 30 * DAY)).reconcile_once()
    assert not (result.ca_created or result.ca_rotated or result.cert_issued)
    assert before == {n: (await secret(cluster, n))["data"] for n in before}


async def test_unusable_secrets_are_replaced(cluster: KubeApi) -> None:
    await cluster.create(SECRETS, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{SVC}-ca", "namespace": NS},
        "data": {"ca.crt": base64.b64encode(b"garbage").decode()}})
    stranger = pki.generate_ca("stranger", 30, now=T0)
    bad_leaf = pki.issue_for_service(stranger, SVC, NS, 30, now=T0)  # not signed by our CA
    await cluster.create(SECRETS, {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": f"{SVC}-tls", "namespace": NS},
        "data": {"tls.crt": base64.b64encode(bad_leaf.cert_pem).decode(),
                 "tls.key": base64.b64encode(bad_leaf.key_pem).decode()}})
    result = await SelfCertManager(cluster, config(), Clock(T0)).reconcile_once()
    assert result.ca_rotated and result.cert_issued
    leaf, _ = await assert_consistent(cluster)
    assert not pki.signed_by(leaf, stranger.cert_pem)


async def test_staged_rotation_keeps_old_and_new_ca_in_the_bundle(cluster: KubeApi) -> None:
    clock = Clock(T0)
    manager = SelfCertManager(cluster, config(ca_days=10, cert_days=3, rotate_before=DAY), clock)
    await manager.reconcile_once()
    first_ca = data(await secret(cluster, f"{SVC}-ca"), "ca.crt")

    # serving certificate due (less than a day left), CA fine: same CA, new leaf
    clock.now = T0 + 2.1 * DAY
    result = await manager.reconcile_once()
    assert result.cert_issued and not result.ca_rotated and result.trusted_cas == 1
    await assert_consistent(cluster)
    for step in (4.2, 6.3):
        clock.now = T0 + step * DAY
        assert (await manager.reconcile_once()).cert_issued

    # CA within 2 days of expiry: a new CA joins the bundle; the serving certificate (1.2 days
    # left, signed by the old CA that every bundle still trusts) stays for now
    clock.now = T0 + 8.1 * DAY
    leaf_before = data(await secret(cluster, f"{SVC}-tls"), "tls.crt")
    result = await manager.reconcile_once()
    assert result.ca_rotated and not result.cert_issued and result.trusted_cas == 2
    assert len(result.patched) == 2
    leaf, trusted = await assert_consistent(cluster)
    assert leaf == leaf_before
    second_ca = data(await secret(cluster, f"{SVC}-ca"), "ca.crt")
    assert pki.load_certificates(trusted) == pki.load_certificates(second_ca + first_ca)

    # then the serving certificate moves to the new CA; both CAs still trusted
    clock.now = T0 + 8.4 * DAY
    result = await manager.reconcile_once()
    assert result.cert_issued and result.trusted_cas == 2 and not result.patched
    leaf, trusted = await assert_consistent(cluster)
    assert pki.signed_by(leaf, second_ca) and not pki.signed_by(leaf, first_ca)

    # the old CA expires: it leaves the bundles
    clock.now = T0 + 10.1 * DAY
    result = await manager.reconcile_once()
    assert result.trusted_cas == 1 and len(result.patched) == 2 and not result.cert_issued
    _, trusted = await assert_consistent(cluster)
    assert pki.load_certificates(trusted) == pki.load_certificates(second_ca)


async def test_replicas_racing_agree_on_one_ca(cluster: KubeApi,
                                               kubeconfig: Any) -> None:
    from webhook.kube import make_api_client  # noqa: PLC0415

    clients = [await make_api_client(str(kubeconfig)) for _ in range(6)]
    try:
        clock = Clock(T0)
        cfg = config(ca_days=10, cert_days=3, rotate_before=DAY)
        managers = [SelfCertManager(KubeApi(c), cfg, clock) for c in clients]
        results = await asyncio.gather(*(m.reconcile_once() for m in managers))
        assert sum(r.ca_created for r in results) == 1
        assert {r.trusted_cas for r in results} == {1}
        await assert_consistent(cluster)

        clock.now = T0 + 8.5 * DAY  # everyone finds the CA and the leaf due at once
        results = await asyncio.gather(*(m.reconcile_once() for m in managers))
        assert sum(r.ca_rotated for r in results) == 1
        assert {r.trusted_cas for r in results} == {2}  # one new CA, not six
        leaf, trusted = await assert_consistent(cluster)
        assert len(pki.load_certificates(trusted)) == 2
        assert pki.signed_by(leaf, pki.cert_pem(pki.load_certificates(trusted)[0]))
    finally:
        for c in clients:
            await c.close()


async def test_api_errors_surface_as_cert_manager_error(apiserver: ApiServerEmulator,
                                                        kube: KubeApi) -> None:
    # the namespace does not exist: the Secret cannot be created
    with pytest.raises(CertManagerError, match=r"404|not found|NotFound"):
        await SelfCertManager(kube, config(), Clock(T0)).reconcile_once()


def test_inconsistent_lifetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="cert_days"):
        config(cert_days=10, rotate_before=10 * DAY)
    with pytest.raises(ValueError, match="ca_days"):
        config(ca_days=50, rotate_before=30 * DAY)


async def test_remove_webhook_configurations_is_idempotent(cluster: KubeApi) -> None:
    removed = await remove_webhook_configurations(cluster, (CONFIG,), (CONFIG,))
    assert removed == [f"mutatingwebhookconfigurations/{CONFIG}",
                       f"validatingwebhookconfigurations/{CONFIG}"]
    assert (await cluster.list(MUTATING_WEBHOOKS))["items"] == []
    assert await remove_webhook_configurations(cluster, (CONFIG,), (CONFIG,)) == []


async def test_run_keeps_retrying_until_the_api_lets_it(kube: KubeApi) -> None:
    """run() never raises: the namespace is missing at first, then appears."""
    manager = SelfCertManager(kube, config(), Clock(T0))
    task = asyncio.create_task(manager.run(0.05))
    try:
        await asyncio.sleep(0.2)
        assert not task.done()
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": NS}})
        for _ in range(100):
            try:
                await secret(kube, f"{SVC}-tls")
                break
            except ApiError:
                await asyncio.sleep(0.05)
        tls = await secret(kube, f"{SVC}-tls")
        assert pki.key_matches(data(tls, "tls.crt"), data(tls, "tls.key"))
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_cli_ensure_and_remove_webhooks(cluster: KubeApi, kubeconfig: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.cli import main  # noqa: PLC0415

    common = ["--kubeconfig", str(kubeconfig)]
    names = ["--mutating-webhook-configuration", CONFIG,
             "--validating-webhook-configuration", CONFIG]
    ensure = ["certs", "ensure", *common, "--namespace", NS, "--service-name", SVC, *names]
    assert await asyncio.to_thread(main, ensure) == 0
    assert "1 trusted CA(s)" in capsys.readouterr().out
    await assert_consistent(cluster)
    bad = [*ensure, "--cert-days", "10", "--rotate-before-days", "10"]
    assert await asyncio.to_thread(main, bad) == 2
    assert "cert_days (10) must exceed" in capsys.readouterr().err
    remove = ["certs", "remove-webhooks", *common, *names]
    assert await asyncio.to_thread(main, remove) == 0
    assert "validatingwebhookconfigurations/0-muster" in capsys.readouterr().out
    assert (await cluster.list(VALIDATING_WEBHOOKS))["items"] == []
    assert await asyncio.to_thread(main, remove) == 0
    assert "nothing (already gone)" in capsys.readouterr().out

    # the post-delete hook: the Secrets `ensure` made, and a Lease; other Secrets stay
    await cluster.create(SECRETS, {"apiVersion": "v1", "kind": "Secret",
                                   "metadata": {"name": "someone-else", "namespace": NS}},
                         namespace=NS)
    await cluster.create(LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                  "metadata": {"name": "muster-binder", "namespace": NS}},
                         namespace=NS)
    cleanup = ["certs", "remove-runtime-objects", *common, "--namespace", NS,
               "--secret", TLS, "--secret", CA, "--lease", "muster-binder"]
    assert await asyncio.to_thread(main, cleanup) == 0
    assert capsys.readouterr().out.split("removed: ")[1].split(", ") == [
        f"secrets/{TLS}", f"secrets/{CA}", "leases/muster-binder\n"]
    left = [s["metadata"]["name"] for s in (await cluster.list(SECRETS, NS))["items"]]
    assert left == ["someone-else"]
    assert (await cluster.list(LEASES, NS))["items"] == []
    assert await asyncio.to_thread(main, cleanup) == 0
    assert "nothing (already gone)" in capsys.readouterr().out
