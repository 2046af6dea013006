"""`muster certs ...`: local development certificates and the one-shot `self` mode reconcile."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = sub.add_parser("certs", help="webhook TLS certificates")
    csub = certs.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    init = csub.add_parser(
        "init",
        help="create a CA and a serving certificate on disk for local development",
        description="Writes ca.crt, ca.key, tls.crt, tls.key under --out. Valid existing files "
        "are kept unless --force.",
    )
    init.add_argument("--out", type=Path, default=Path("certs"), help="directory (default: certs)")
    init.add_argument("--service", default="muster-webhook", help="Service name for the SANs")
    init.add_argument("--namespace", default="muster-system", help="namespace for the SANs")
    init.add_argument("--days", type=int, default=365, help="serving certificate lifetime")
    init.add_argument("--ca-days", type=int, default=3650, help="CA lifetime")
    init.add_argument("--force", action="store_true", help="regenerate even valid files")
    init.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    from webhook.certs.local import init_local  # noqa: PLC0415 (keep the CLI light)
    from webhook.certs.pki import PkiError  # noqa: PLC0415

    try:
        files, written = init_local(
            args.out, args.service, args.namespace,
            days=args.days, ca_days=args.ca_days, force=args.force,
        )
    except PkiError as exc:
        print(f"muster certs init: {exc}")
        return 2
    state = ", ".join(written) + " written" if written else "existing files still valid"
    print(f"{state}: {files.ca_cert} {files.cert} {files.key}")
    print(f"serve with: muster serve --tls-cert-file {files.cert} --tls-key-file {files.key}")
    return 0
