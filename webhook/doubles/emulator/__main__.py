"""`python -m webhook.doubles.emulator --port N --kubeconfig PATH [--crds DIR] [--seed FILE...]`:
the emulator as a process, for e2e tests that start components as processes."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from webhook import log

from .server import ApiServerEmulator


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m webhook.doubles.emulator", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    p.add_argument("--crds", type=Path, help="directory of CustomResourceDefinition YAML files")
    p.add_argument("--seed", type=Path, nargs="*", default=[],
                   help="YAML files of objects to create at start (namespaces, nodes...)")
    p.add_argument("--service-host", action="append", default=[], metavar="NS/NAME=HOST:PORT",
                   help="where a webhook clientConfig.service is served (no cluster DNS here)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-json", action="store_true")
    return p.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    service_hosts = {}
    for item in args.service_host:
        svc, _, target = item.partition("=")
        ns, _, name = svc.partition("/")
        service_hosts[(ns, name)] = target
    api = ApiServerEmulator(args.host, args.port, service_hosts=service_hosts)
    if args.crds:
        for path in sorted(args.crds.glob("*.yaml")):
            api.load_yaml(path)
    for path in args.seed:
        api.load_yaml(path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with api:
        api.write_kubeconfig(args.kubeconfig)
        print(api.url, flush=True)  # the parent process reads the URL from the first line
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    log.setup(args.log_level, args.log_json)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
