"""`muster certs ...`: local development certificates and the one-shot `self` mode reconcile."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from webhook.certs.options import add_self_cert_arguments, self_cert_config
from webhook.failures import check_directory
from webhook.signals import until_signalled

if TYPE_CHECKING:
    from webhook.certs.manager import SelfCertManager
    from webhook.kube import KubeApi


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

    ensure = csub.add_parser(
        "ensure", help="one reconcile of the self-managed certificates (Helm hook Job)",
        description="Creates the CA and serving Secrets if missing (never replacing valid ones), "
        "rotates what is due, and sets the caBundle of the named webhook configurations.")
    _kube_arguments(ensure)
    add_self_cert_arguments(ensure)
    ensure.set_defaults(func=_ensure)

    run = csub.add_parser(
        "run", help="keep the self-managed certificates current (webhook pod sidecar)",
        description="`ensure`, then again every --interval seconds and when a rotation is due.")
    _kube_arguments(run)
    add_self_cert_arguments(run)
    run.add_argument("--interval", type=float, default=3600.0,
                     help="seconds between checks (default 3600)")
    run.set_defaults(func=_run)

    remove = csub.add_parser(
        "remove-webhooks", help="delete Muster's webhook configurations (uninstall hook Job)",
        description="Takes Muster out of the admission path first on uninstall; missing "
        "configurations are not an error.")
    _kube_arguments(remove)
    remove.add_argument("--mutating-webhook-configuration", action="append", default=[],
                        metavar="NAME", help="(repeatable)")
    remove.add_argument("--validating-webhook-configuration", action="append", default=[],
                        metavar="NAME", help="(repeatable)")
    remove.set_defaults(func=_remove)

    leftovers = csub.add_parser(
        "remove-runtime-objects",
        help="delete the Secrets and Lease Muster created at run time (post-delete hook Job)",
        description="After `helm uninstall` removed the release, deletes what the components "
        "created themselves: the `self` mode CA and serving Secrets and the binder's Lease. "
        "Missing objects are not an error.")
    _kube_arguments(leftovers)
    leftovers.add_argument("--namespace", required=True, help="the release namespace")
    leftovers.add_argument("--secret", action="append", default=[], metavar="NAME",
                           help="(repeatable)")
    leftovers.add_argument("--lease", action="append", default=[], metavar="NAME",
                           help="(repeatable)")
    leftovers.set_defaults(func=_remove_runtime_objects)


def _kube_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account "
                   "in a pod, else $KUBECONFIG or ~/.kube/config)")


def _init(args: argparse.Namespace) -> int:
    from webhook.certs.local import init_local  # noqa: PLC0415 (keep the CLI light)
    from webhook.certs.pki import PkiError  # noqa: PLC0415

    check_directory("--out", args.out)
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
    # policies/: the admins' folder at the top of a checkout (give your own elsewhere)
    print(f"serve with: muster serve --policies policies/ --tls-cert-file {files.cert} "
          f"--tls-key-file {files.key}")
    return 0


def _with_manager(args: argparse.Namespace,
                  body: Callable[[SelfCertManager], Awaitable[int]]) -> int:
    from webhook.certs.manager import SelfCertManager  # noqa: PLC0415
    from webhook.kube import KubeApi, make_api_client  # noqa: PLC0415

    try:
        cfg = self_cert_config(args)
    except ValueError as exc:
        print(f"muster certs: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        client = await make_api_client(args.kubeconfig)
        try:
            return await body(SelfCertManager(KubeApi(client), cfg))
        finally:
            await client.close()

    return asyncio.run(main())


def _ensure(args: argparse.Namespace) -> int:
    from webhook.certs.manager import CertManagerError  # noqa: PLC0415

    async def once(manager: SelfCertManager) -> int:
        try:
            result = await manager.reconcile_once()
        except CertManagerError as exc:
            print(f"muster certs ensure: {exc}", file=sys.stderr)
            return 1
        print(f"certificates ready: serving certificate valid until {result.cert_not_after}, "
              f"{result.trusted_cas} trusted CA(s), patched {result.patched or 'nothing'}"
              + (f", not found (yet) {result.missing}" if result.missing else ""))
        return 0

    return _with_manager(args, once)


def _run(args: argparse.Namespace) -> int:
    async def forever(manager: SelfCertManager) -> int:
        await until_signalled(manager.run(args.interval))
        return 0

    return _with_manager(args, forever)


def _remove(args: argparse.Namespace) -> int:
    from webhook.certs.manager import remove_webhook_configurations  # noqa: PLC0415

    return _removal(args, "remove-webhooks", lambda api: remove_webhook_configurations(
        api, tuple(args.mutating_webhook_configuration),
        tuple(args.validating_webhook_configuration)))


def _remove_runtime_objects(args: argparse.Namespace) -> int:
    from webhook.certs.manager import remove_named  # noqa: PLC0415
    from webhook.kube import LEASES, SECRETS  # noqa: PLC0415

    ns = args.namespace
    targets = [*((SECRETS, n, ns) for n in args.secret), *((LEASES, n, ns) for n in args.lease)]
    return _removal(args, "remove-runtime-objects", lambda api: remove_named(api, targets))


def _removal(args: argparse.Namespace, command: str,
             remove: Callable[[KubeApi], Awaitable[list[str]]]) -> int:
    from webhook.kube import ApiError, KubeApi, make_api_client  # noqa: PLC0415

    async def main() -> int:
        client = await make_api_client(args.kubeconfig)
        try:
            removed = await remove(KubeApi(client))
        except ApiError as exc:
            print(f"muster certs {command}: {exc}", file=sys.stderr)
            return 1
        finally:
            await client.close()
        print(f"removed: {', '.join(removed) or 'nothing (already gone)'}")
        return 0

    return asyncio.run(main())
