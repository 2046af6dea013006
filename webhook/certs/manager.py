"""The `self` certificate manager: Muster's own CA, serving certificate and caBundle.

State lives in the cluster, in two Secrets of the webhook's namespace:
- the CA Secret (Opaque): `ca.crt` + `ca.key` of the signing CA, and `ca-bundle.crt`, every CA
  still trusted (the current one first, older ones until they expire);
- the serving Secret (kubernetes.io/tls): `tls.crt`, `tls.key`, and `ca.crt` (the trusted bundle),
  mounted by the webhook pods, which reload the files when the kubelet updates them.

Rotation is staged so that the API server never meets a certificate it does not trust:
the CA is replaced when less than 2 x `rotate_before` of it remains, and the new CA goes into the
webhook configurations' caBundle next to the old one; the serving certificate (always issued to
end no later than its CA) is replaced when less than `rotate_before` remains, by then signed by
the new CA, which every caBundle already holds. The old CA leaves the bundle when it expires.

Several replicas may run this at once: Secrets are created with POST (409 → someone else won,
re-read) and changed with PUT on the resourceVersion read (409 → re-read and decide again), so
a valid Secret is never overwritten and exactly one new CA wins a rotation.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.certs import pki
from webhook.kube import (
    MUTATING_WEBHOOKS,
    SECRETS,
    VALIDATING_WEBHOOKS,
    ApiError,
    KubeApi,
    Resource,
)

log = logging.getLogger(__name__)

CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
CA_BUNDLE_KEY = "ca-bundle.crt"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"
MANAGED_BY = "muster-certs"
_MAX_ATTEMPTS = 8


class CertManagerError(RuntimeError):
    """The reconcile could not finish (API errors, or conflicts that kept coming back)."""


@dataclass(frozen=True)
class SelfCertConfig:
    """What the manager owns and how long things live."""

    namespace: str
    service_name: str
    tls_secret: str
    ca_secret: str
    mutating_webhook_configurations: tuple[str, ...] = ()
    validating_webhook_configurations: tuple[str, ...] = ()
    ca_days: int = 3650
    cert_days: int = 365
    rotate_before: dt.timedelta = dt.timedelta(days=30)

    def __post_init__(self) -> None:
        life = dt.timedelta(days=self.cert_days)
        if self.rotate_before <= dt.timedelta(0):
            raise ValueError("rotate_before must be positive")
        if life <= self.rotate_before:
            raise ValueError(f"cert_days ({self.cert_days}) must exceed the rotation threshold "
                             f"({self.rotate_before.days} days), or every run would re-issue")
        if dt.timedelta(days=self.ca_days) <= 2 * self.rotate_before:
            raise ValueError(f"ca_days ({self.ca_days}) must exceed twice the rotation threshold "
                             f"({2 * self.rotate_before.days} days)")

    @classmethod
    def for_service(cls, service_name: str, namespace: str, **kw: Any) -> SelfCertConfig:
        """Defaults the chart also uses: Secrets `<service>-tls` and `<service>-ca`."""
        kw.setdefault("tls_secret", f"{service_name}-tls")
        kw.setdefault("ca_secret", f"{service_name}-ca")
        return cls(namespace=namespace, service_name=service_name, **kw)

    @property
    def dns_names(self) -> list[str]:
        return pki.service_dns_names(self.service_name, self.namespace)


# --- pure decisions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaMaterial:
    ca: pki.KeyPair
    trusted: bytes  # PEM bundle, current CA first


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret_bytes(secret: Mapping[str, Any] | None, key: str) -> bytes | None:
    raw = ((secret or {}).get("data") or {}).get(key)
    if not raw:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return None


def read_ca(secret: Mapping[str, Any] | None) -> CaMaterial | None:
    """The CA in a CA Secret, or None when it is missing or unusable (bad PEM, key mismatch)."""
    cert, key = _secret_bytes(secret, CA_CERT_KEY), _secret_bytes(secret, CA_KEY_KEY)
    if cert is None or key is None:
        return None
    try:
        if not pki.key_matches(cert, key):
            return None
        trusted = _secret_bytes(secret, CA_BUNDLE_KEY) or b""
        return CaMaterial(pki.KeyPair(cert, key), pki.bundle([cert, trusted]))
    except pki.PkiError:
        return None


def unexpired(bundle_pem: bytes, now: dt.datetime) -> bytes:
    return pki.bundle(pki.cert_pem(c) for c in pki.load_certificates(bundle_pem)
                      if c.not_valid_after_utc > now)


def ca_due(ca: CaMaterial, cfg: SelfCertConfig, now: dt.datetime) -> bool:
    """Replace the CA this early so the serving certificate can move to the new one later."""
    return pki.not_after(ca.ca.cert_pem) - now <= 2 * cfg.rotate_before


def new_ca(old: CaMaterial | None, cfg: SelfCertConfig, now: dt.datetime) -> CaMaterial:
    ca = pki.generate_ca(f"muster-webhook-ca ({cfg.namespace}/{cfg.service_name})", cfg.ca_days,
                         now=now)
    previous = unexpired(old.trusted, now) if old else b""
    return CaMaterial(ca, pki.bundle([ca.cert_pem, previous]))


def serving_cert_ok(secret: Mapping[str, Any] | None, ca: CaMaterial, cfg: SelfCertConfig,
                    now: dt.datetime) -> bool:
    """Whether the serving Secret holds a certificate worth keeping."""
    cert, key = _secret_bytes(secret, TLS_CERT_KEY), _secret_bytes(secret, TLS_KEY_KEY)
    if cert is None or key is None:
        return False
    try:
        return (pki.key_matches(cert, key)
                and pki.signed_by(cert, unexpired(ca.trusted, now))
                and sorted(pki.dns_names(cert)) == sorted(cfg.dns_names)
                and pki.not_after(cert) - now > cfg.rotate_before)
    except pki.PkiError:
        return False


def ca_secret_body(cfg: SelfCertConfig, ca: CaMaterial) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": cfg.ca_secret, "namespace": cfg.namespace,
                     "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}},
        "data": {CA_CERT_KEY: _b64(ca.ca.cert_pem), CA_KEY_KEY: _b64(ca.ca.key_pem),
                 CA_BUNDLE_KEY: _b64(ca.trusted)},
    }


def tls_secret_body(cfg: SelfCertConfig, leaf: pki.KeyPair, trusted: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": cfg.tls_secret, "namespace": cfg.namespace,
                     "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}},
        "data": {TLS_CERT_KEY: _b64(leaf.cert_pem), TLS_KEY_KEY: _b64(leaf.key_pem),
                 CA_CERT_KEY: _b64(trusted)},
    }


def with_ca_bundle(config: Mapping[str, Any], bundle_pem: bytes) -> dict[str, Any] | None:
    """The webhook configuration with every webhook's caBundle set, or None if already so."""
    want = _b64(bundle_pem)
    webhooks = [dict(w) for w in config.get("webhooks") or []]
    changed = False
    for wh in webhooks:
        client = dict(wh.get("clientConfig") or {})
        if client.get("caBundle") != want:
            client["caBundle"] = want
            wh["clientConfig"] = client
            changed = True
    return {**config, "webhooks": webhooks} if changed else None


@dataclass
class ReconcileResult:
    ca_created: bool = False
    ca_rotated: bool = False
    cert_issued: bool = False
    patched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    ca_not_after: dt.datetime | None = None
    cert_not_after: dt.datetime | None = None
    trusted_cas: int = 0

    def next_due(self, cfg: SelfCertConfig) -> dt.datetime | None:
        """When the next rotation falls due (None if unknown)."""
        due = [t - d for t, d in ((self.ca_not_after, 2 * cfg.rotate_before),
                                  (self.cert_not_after, cfg.rotate_before)) if t is not None]
        return min(due) if due else None


class _Retry(Exception):
    """A concurrent writer changed what we read: read again and decide again."""


# --- I/O -----------------------------------------------------------------------------------------


class SelfCertManager:
    """`await reconcile_once()` for a one-shot (Helm hook), `await run(interval)` to keep going."""

    def __init__(self, api: KubeApi, cfg: SelfCertConfig,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        self.api = api
        self.cfg = cfg
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))

    async def reconcile_once(self) -> ReconcileResult:
        """Make the Secrets and caBundles right; raises CertManagerError when it cannot."""
        result = ReconcileResult()  # what this call did, across conflict retries
        for _ in range(_MAX_ATTEMPTS):
            result.missing.clear()
            try:
                await self._reconcile(self._clock(), result)
            except _Retry:
                await asyncio.sleep(0)  # let the other writer finish
                continue
            except ApiError as exc:
                raise CertManagerError(f"certificate reconcile failed: {exc}") from exc
            log.info("certificates reconciled", extra={
                "ca_created": result.ca_created, "ca_rotated": result.ca_rotated,
                "cert_issued": result.cert_issued, "patched": ",".join(result.patched),
                "missing": ",".join(result.missing), "trusted_cas": result.trusted_cas,
                "cert_not_after": result.cert_not_after})
            return result
        raise CertManagerError(f"certificate reconcile gave up after {_MAX_ATTEMPTS} conflicts")

    async def run(self, interval: float) -> None:
        """Reconcile now, then every `interval` seconds (sooner when a rotation falls due);
        errors are logged and retried, never raised: rotation must outlive API hiccups."""
        while True:
            delay = interval
            try:
                result = await self.reconcile_once()
            except CertManagerError as exc:
                log.warning("certificate reconcile failed, retrying", extra={"error": str(exc)})
                delay = min(interval, 30.0)
            else:
                due = result.next_due(self.cfg)
                if due is not None:
                    delay = min(interval, max((due - self._clock()).total_seconds(), 1.0))
            await asyncio.sleep(delay)

    async def remove_webhook_configurations(self) -> list[str]:
        """Delete the configurations (uninstall); returns those that existed."""
        return await remove_webhook_configurations(
            self.api, self.cfg.mutating_webhook_configurations,
            self.cfg.validating_webhook_configurations)

    # --- steps ---

    async def _get(self, resource: Any, name: str, namespace: str | None = None
                   ) -> dict[str, Any] | None:
        try:
            return await self.api.get(resource, name, namespace)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def _write(self, resource: Any, body: dict[str, Any], current: Mapping[str, Any] | None,
                     namespace: str | None) -> None:
        """Create (when `current` is None) or replace on `current`'s resourceVersion."""
        try:
            if current is None:
                await self.api.create(resource, body, namespace)
            else:
                meta = {**body["metadata"],
                        "resourceVersion": current["metadata"]["resourceVersion"]}
                await self.api.replace(resource, body["metadata"]["name"],
                                       {**body, "metadata": meta}, namespace)
        except ApiError as exc:
            if exc.conflict:
                raise _Retry from exc
            raise

    async def _reconcile(self, now: dt.datetime, result: ReconcileResult) -> None:
        cfg = self.cfg

        # 1. the CA: created once, replaced only when due or unusable
        ca_obj = await self._get(SECRETS, cfg.ca_secret, cfg.namespace)
        ca = read_ca(ca_obj)
        if ca is None or ca_due(ca, cfg, now):
            if ca_obj is not None and ca is None:
                log.warning("CA Secret unusable, replacing it", extra={"secret": cfg.ca_secret})
            ca_new = new_ca(ca, cfg, now)
            await self._write(SECRETS, ca_secret_body(cfg, ca_new), ca_obj, cfg.namespace)
            if ca_obj is None:
                result.ca_created = True
            else:
                result.ca_rotated = True
            ca = ca_new
        elif (pruned := pki.bundle([ca.ca.cert_pem, unexpired(ca.trusted, now)])) != ca.trusted:
            ca = CaMaterial(ca.ca, pruned)
            await self._write(SECRETS, ca_secret_body(cfg, ca), ca_obj, cfg.namespace)

        # 2. trust before use: every caBundle holds the new CA before anything is signed by it
        for resource, names in ((MUTATING_WEBHOOKS, cfg.mutating_webhook_configurations),
                                (VALIDATING_WEBHOOKS, cfg.validating_webhook_configurations)):
            for name in names:
                current = await self._get(resource, name)
                if current is None:
                    result.missing.append(f"{resource.plural}/{name}")
                    continue
                updated = with_ca_bundle(current, ca.trusted)
                if updated is not None:
                    await self._write(resource, updated, current, None)
                    if f"{resource.plural}/{name}" not in result.patched:
                        result.patched.append(f"{resource.plural}/{name}")

        # 3. the serving certificate
        tls_obj = await self._get(SECRETS, cfg.tls_secret, cfg.namespace)
        if serving_cert_ok(tls_obj, ca, cfg, now):
            leaf = pki.KeyPair(_secret_bytes(tls_obj, TLS_CERT_KEY) or b"",
                               _secret_bytes(tls_obj, TLS_KEY_KEY) or b"")
            issue = False
        else:
            leaf = pki.issue_serving_cert(ca.ca, cfg.dns_names, pki.LOCAL_IPS, cfg.cert_days,
                                          now=now)
            issue = True
        if issue or _secret_bytes(tls_obj, CA_CERT_KEY) != ca.trusted:
            await self._write(SECRETS, tls_secret_body(cfg, leaf, ca.trusted), tls_obj,
                              cfg.namespace)
        result.cert_issued = result.cert_issued or issue

        result.ca_not_after = pki.not_after(ca.ca.cert_pem)
        result.cert_not_after = pki.not_after(leaf.cert_pem)
        result.trusted_cas = len(pki.load_certificates(ca.trusted))


async def remove_named(api: KubeApi, targets: Sequence[tuple[Resource, str, str | None]]
                       ) -> list[str]:
    """Delete (resource, name, namespace) objects in order; missing ones are fine (uninstall is
    idempotent). Returns those that existed, as `plural/name`."""
    removed = []
    for resource, name, namespace in targets:
        try:
            await api.delete(resource, name, namespace)
        except ApiError as exc:
            if not exc.not_found:
                raise
            continue
        removed.append(f"{resource.plural}/{name}")
        log.info("deleted on uninstall", extra={"object": name, "kind": resource.plural})
    return removed


async def remove_webhook_configurations(api: KubeApi, mutating: tuple[str, ...],
                                        validating: tuple[str, ...]) -> list[str]:
    """Delete webhook configurations by name (the pre-delete hook)."""
    return await remove_named(api, [*((MUTATING_WEBHOOKS, n, None) for n in mutating),
                                    *((VALIDATING_WEBHOOKS, n, None) for n in validating)])
