"""Command-line options of the `self` certificate manager, shared by `muster certs ensure|run`
and any server embedding the manager (argparse only: importing this stays cheap)."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from webhook.certs.manager import SelfCertConfig


def add_self_cert_arguments(p: argparse.ArgumentParser, *, with_identity: bool = True) -> None:
    """--namespace/--service-name (skip with with_identity=False when the parser has them)."""
    if with_identity:
        p.add_argument("--namespace", required=True, help="namespace of the webhook Service "
                       "and of the certificate Secrets")
        p.add_argument("--service-name", required=True,
                       help="webhook Service name (the certificate's DNS names)")
    p.add_argument("--tls-secret", help="serving certificate Secret (default <service>-tls)")
    p.add_argument("--ca-secret", help="CA Secret (default <service>-ca)")
    p.add_argument("--mutating-webhook-configuration", action="append", default=[],
                   metavar="NAME", help="configuration whose caBundle is kept current "
                   "(repeatable)")
    p.add_argument("--validating-webhook-configuration", action="append", default=[],
                   metavar="NAME", help="likewise, validating (repeatable)")
    p.add_argument("--ca-days", type=int, default=3650, help="CA lifetime (default 3650)")
    p.add_argument("--cert-days", type=int, default=365,
                   help="serving certificate lifetime (default 365)")
    p.add_argument("--rotate-before-days", type=int, default=30,
                   help="re-issue the serving certificate when fewer days remain; the CA is "
                   "replaced at twice this (default 30)")


def self_cert_config(args: argparse.Namespace) -> SelfCertConfig:
    """The manager's config from parsed arguments (ValueError on inconsistent lifetimes)."""
    from webhook.certs.manager import SelfCertConfig  # noqa: PLC0415 (keep the CLI light)

    kw = {}
    if args.tls_secret:
        kw["tls_secret"] = args.tls_secret
    if args.ca_secret:
        kw["ca_secret"] = args.ca_secret
    return SelfCertConfig.for_service(
        args.service_name, args.namespace,
        mutating_webhook_configurations=tuple(args.mutating_webhook_configuration),
        validating_webhook_configurations=tuple(args.validating_webhook_configuration),
        ca_days=args.ca_days, cert_days=args.cert_days,
        rotate_before=dt.timedelta(days=args.rotate_before_days), **kw)
