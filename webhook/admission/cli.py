"""`muster serve`: the admission webhook server (argparse only; the server is imported lazily)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from webhook.failures import UsageError, check_directory, check_port

MiB = 1024 * 1024
N = TypeVar("N", int, float)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve", help="run the admission webhook server (HTTPS)",
        description="Apply Muster policies to every pod created: mutating webhook /mutate/pods, "
                    "validating webhook /validate/policies, /healthz, /readyz; /metrics on "
                    "--metrics-port.")
    _listen_args(p)
    _certificate_args(p)
    _cluster_args(p)
    _limit_args(p)
    _owner_args(p)
    p.add_argument("--log-json", action="store_true", default=argparse.SUPPRESS,
                   help="one JSON object per log line (same as the global --log-json)")
    p.set_defaults(func=_serve)


def _listen_args(p: argparse.ArgumentParser) -> None:
    """Where the server listens, and what it serves."""
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve /metrics (Prometheus) and /healthz over plain HTTP on this port, "
                        "never on the admission port (default: no metrics; the chart gives "
                        "8080)")
    p.add_argument("--metrics-host", default="0.0.0.0",
                   help="address the metrics port listens on (default 0.0.0.0; 127.0.0.1 "
                        "keeps it inside the pod)")
    p.add_argument("--policies", nargs="+", type=Path, required=True, metavar="DIR|FILE",
                   help="policy files or directories (a mounted ConfigMap); reloaded on change")


def _certificate_args(p: argparse.ArgumentParser) -> None:
    """The serving certificate, and the cluster access that self mode keeps it current with."""
    p.add_argument("--tls-cert-file", type=Path, help="serving certificate (PEM); reloaded on "
                   "change")
    p.add_argument("--tls-key-file", type=Path, help="serving certificate's key (PEM)")
    p.add_argument("--self-signed", action="store_true",
                   help="generate a CA and serving certificate at start (local use)")
    p.add_argument("--self-signed-dir", type=Path,
                   help="where --self-signed writes ca.crt, tls.crt, tls.key (default: a "
                        "temporary directory, logged and removed when the server stops)")
    p.add_argument("--kubeconfig", help="kubeconfig file; default: in-cluster config when "
                   "running in a pod, else no cluster context")
    p.add_argument("--cert-mode", choices=["files", "self"], default="files",
                   help="files: serve --tls-cert-file/--tls-key-file as given (cert-manager, "
                        "external); self: also run the self-signed certificate manager")
    p.add_argument("--webhook-configuration", action="append", default=[], metavar="NAME",
                   help="self mode: Mutating/ValidatingWebhookConfiguration whose caBundle is "
                        "kept current (repeatable)")
    p.add_argument("--service-name", default="muster-webhook",
                   help="webhook Service name (certificate SANs, self mode)")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    """The server's namespace, what it leaves alone, and Muster's own annotations."""
    p.add_argument("--namespace", default="muster-system",
                   help="the server's own namespace: never mutated; holds the policies "
                        "ConfigMap and the certificate Secret")
    p.add_argument("--exclude-namespace", action="append", default=[], metavar="NS",
                   help="another namespace never mutated (repeatable); kube-system, "
                        "kube-public and kube-node-lease always are")
    p.add_argument("--policies-configmap", default="muster-policies",
                   help="ConfigMap that Events about refused policy updates are attached to")
    p.add_argument("--on-user-assignment", choices=["strip", "deny"], default="strip",
                   help="a pod created with a muster.io/ annotation only Muster's binder "
                        "or node agent writes (gpu-assignment, gang-placement, gpu-allocated, "
                        "any key the webhook does not write): remove it (default) or deny "
                        "the pod")


def _limit_args(p: argparse.ArgumentParser) -> None:
    """What one client may hold (docs/webhook.md, "Limits")."""
    limits = p.add_argument_group(
        "limits", "what one client may hold (docs/webhook.md, \"Limits\"); the defaults fit "
        "a 256 MiB memory limit")
    limits.add_argument("--max-body-bytes", type=_positive(int), default=3 * MiB,
                        help="larger requests get HTTP 413 unread (default 3 MiB, "
                             "kube-apiserver's own request limit)")
    limits.add_argument("--body-timeout", type=_positive(float), default=10.0,
                        metavar="SECONDS", help="a request body must arrive within this once "
                        "its headers have, or gets HTTP 408 (default 10)")
    limits.add_argument("--max-inflight-body-bytes", type=_positive(int), default=16 * MiB,
                        help="request bodies being read hold at most this many bytes "
                             "together; the others wait, within --body-timeout (default "
                             "16 MiB)")
    limits.add_argument("--header-timeout", type=_positive(float), default=10.0,
                        metavar="SECONDS", help="a connection must finish its TLS handshake "
                        "and send its first request's headers within this, or is closed "
                        "(default 10)")
    limits.add_argument("--idle-timeout", type=_positive(float), default=120.0,
                        metavar="SECONDS", help="an idle kept-alive connection is closed "
                        "after this (default 120: above kube-apiserver's 90 s, so no close "
                        "meets a request it sends; at --max-connections the one idle longest "
                        "is closed at once for a new one)")
    limits.add_argument("--max-connections", type=_positive(int), default=128,
                        help="connections open at once, TLS handshakes included (default "
                             "128; each may hold about 0.5 MiB); at it, a new one closes the "
                             "one that waited longest, or is refused when all serve requests")
    limits.add_argument("--max-connections-per-source", type=_positive(int), default=64,
                        help="connections one client address may hold; past it, a new one "
                             "closes that address's own oldest waiting one (default 64; keep "
                             "it above the API server's concurrent calls to one replica)")
    limits.add_argument("--reserved-connections", type=_not_negative, default=32,
                        help="slots that connections not served yet (TLS handshake, first "
                             "headers) may not take, kept for served ones such as the API "
                             "server's kept-alive connections (default 32)")
    limits.add_argument("--metrics-max-connections", type=_positive(int), default=16,
                        help="the metrics port's connections (default 16; one address may "
                             "hold half, a quarter reserved; same timeouts)")


def _owner_args(p: argparse.ArgumentParser) -> None:
    """Gang jobs' objects and the PodGroups made for them."""
    p.add_argument("--owner-cache-ttl", type=float, default=5.0,
                   help="seconds an owner object (MPIJob, Job...) is reused (default 5)")
    p.add_argument("--podgroup-cleanup-interval", type=float, default=30.0, metavar="SECONDS",
                   help="how often the PodGroups Muster made are checked against their jobs: "
                        "a finished or suspended job's goes, as its operator would delete it "
                        "(default 30; 0 turns it off)")
    p.add_argument("--owner-retry-seconds", type=float, default=60.0,
                   help="while a gang job's object cannot be read, its pods are refused (the "
                        "job's controller retries) for this long, then admitted without the "
                        "gang (default 60)")


def _serve(args: argparse.Namespace) -> int:
    from webhook.admission.server import ServeOptions, run  # noqa: PLC0415
    from webhook.admission.slots import SlotLimits  # noqa: PLC0415

    if not args.self_signed and not (args.tls_cert_file and args.tls_key_file):
        raise UsageError("give --tls-cert-file and --tls-key-file, or --self-signed")
    check_port("--port", args.port)
    check_port("--metrics-port", args.metrics_port)
    check_directory("--self-signed-dir", args.self_signed_dir)
    # the inputs that must exist now (in self mode the Secret may reach its volume later)
    for flag, path in (("--tls-cert-file", args.tls_cert_file),
                       ("--tls-key-file", args.tls_key_file)):
        if path is not None and args.cert_mode != "self" and not Path(path).is_file():
            raise UsageError(f"{flag} {path}: no such file (give the serving certificate's "
                             "PEM files, or --self-signed)")
    for path in args.policies:
        if not Path(path).exists():
            raise UsageError(f"--policies {path}: no such file or directory")
    try:
        SlotLimits(args.max_connections, args.max_connections_per_source,
                   args.reserved_connections)
    except ValueError as exc:
        raise UsageError(f"--max-connections, --reserved-connections: {exc}") from None
    opts = ServeOptions(
        policies=args.policies, host=args.host, port=args.port,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file,
        self_signed=args.self_signed, self_signed_dir=args.self_signed_dir,
        kubeconfig=args.kubeconfig, cert_mode=args.cert_mode,
        service_name=args.service_name, namespace=args.namespace,
        on_user_assignment=args.on_user_assignment, max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout, max_inflight_body_bytes=args.max_inflight_body_bytes,
        header_timeout=args.header_timeout, idle_timeout=args.idle_timeout,
        max_connections=args.max_connections,
        max_connections_per_source=args.max_connections_per_source,
        reserved_connections=args.reserved_connections,
        metrics_max_connections=args.metrics_max_connections,
        exclude_namespaces=args.exclude_namespace, policies_configmap=args.policies_configmap,
        owner_cache_ttl=args.owner_cache_ttl, owner_retry_seconds=args.owner_retry_seconds,
        podgroup_cleanup_interval=args.podgroup_cleanup_interval,
        webhook_configurations=args.webhook_configuration,
        # in self mode the serving Secret may reach its volume only after the manager made it
        cert_wait=60.0 if args.cert_mode == "self" else 0.0)
    asyncio.run(run(opts))
    return 0


def _positive(kind: Callable[[str], N]) -> Callable[[str], N]:
    """An argparse type: a number of `kind` above zero."""
    def parse(text: str) -> N:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its "invalid ..." message
    return parse


def _not_negative(text: str) -> int:
    """An argparse type: a whole number, zero or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value
