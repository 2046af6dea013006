"""Handlers of `muster agent` and `muster agent discover` (imported lazily by cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
from pathlib import Path

from webhook import keys
from webhook.agent import runner
from webhook.agent.deviceplugin.plugin import PluginConfig
from webhook.agent.dra.driver import DraConfig
from webhook.agent.nvml import Nvml, RealNvml
from webhook.agent.nvmlrecord import record_nvml
from webhook.agent.publisher import identify
from webhook.agent.runner import Agent, AgentConfig, Discoverer
from webhook.failures import CommandFailed, UsageError, check_port
from webhook.kube.api import KubeApi
from webhook.kube.client import make_api_client
from webhook.signals import until_signalled
from webhook.topology.codec import to_dict, topology_class


def nvml_source(fake: str | None) -> Nvml:
    """The real NVML, or the fake one that `--fake-nvml` names (a profile or a recorded file)."""
    if fake is None:
        return RealNvml()
    # the agent's one import of the test doubles (.importlinter allows exactly this edge): the
    # chart's agent.extraArgs may give --fake-nvml on nodes without GPUs
    from webhook.doubles.fakenvml import fake_nvml  # noqa: PLC0415

    return fake_nvml(fake)


def _sources(args: argparse.Namespace) -> tuple[Discoverer, Nvml | None]:
    """(discoverer, NVML for XID events or None) from --fake-nvml/--topology-file/--node-type;
    UsageError naming the option when one is wrong."""
    try:
        if args.topology_file or args.node_type:
            return runner.static_discoverer(args.topology_file, args.node_type), None
        nvml = nvml_source(args.fake_nvml)
    except KeyError as exc:  # builtin() and the fake NVML profiles name the known ones
        raise UsageError(str(exc.args[0])) from exc
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    return runner.nvml_discoverer(nvml), nvml


def discover(args: argparse.Namespace) -> int:
    found = _sources(args)[0]()
    topology = identify(found.topology) if found.topology is not None else None
    doc = {
        "class": topology_class(topology) if topology is not None else None,
        "degraded": found.degraded,
        "driverVersion": found.driver_version,
        "degradations": [{"field": d.field, "code": d.code, "message": d.message}
                         for d in found.degradations],
        "topology": to_dict(topology) if topology is not None else None,
    }
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    if topology is None:
        why = "; ".join(d.message for d in found.degradations[:2]) or "no GPU answered"
        raise CommandFailed(f"NVML is not usable here ({why}); on a machine without NVIDIA's "
                            "driver use --fake-nvml or --node-type")
    if args.record:
        if args.topology_file or args.node_type:
            sys.stderr.write("muster agent discover: --record needs NVML (or --fake-nvml)\n")
            return 2
        nvml = nvml_source(args.fake_nvml)
        salt = None if args.keep_uuids else secrets.token_hex(8)
        source = f"muster agent discover on {os.uname().nodename}"
        if args.fake_nvml:
            source += f" (fake NVML {args.fake_nvml})"
        rec = record_nvml(nvml, source=source, anonymise_salt=salt)
        Path(args.record).write_text(rec.to_json() + "\n")
        sys.stderr.write(f"recorded NVML answers to {args.record}\n")
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        sys.stderr.write("muster agent: --node-name (or $NODE_NAME) is required\n")
        return 2
    if not (args.device_plugin or args.dra):
        raise UsageError("--no-device-plugin without --dra serves no GPU: give --dra")
    check_port("--metrics-port", args.metrics_port)
    if args.pod is not None and keys.parse_gpu_agent(args.pod) is None:
        raise UsageError(f"--pod {args.pod!r}: give NAMESPACE/NAME/UID")
    discoverer, events_nvml = _sources(args)
    dra = (DraConfig(node=args.node_name, registry_dir=Path(args.dra_registry_dir),
                     plugin_dir=Path(args.dra_plugin_dir), cdi_dir=Path(args.cdi_dir))
           if args.dra else None)
    config = AgentConfig(
        node=args.node_name,
        device_plugin=args.device_plugin,
        dra=dra,
        rediscover_s=args.rediscover_seconds,
        ack_grace_s=args.ack_grace_seconds,
        plugin=PluginConfig(node=args.node_name, kubelet_dir=Path(args.kubelet_dir),
                            resource_name=args.resource_name, cdi=args.cdi,
                            assignment_wait_s=args.assignment_wait_seconds,
                            unassigned=args.unassigned, scheduler_name=args.scheduler_name,
                            pod_resources=(Path(args.pod_resources_socket)
                                           if args.pod_resources_socket else None),
                            audit_s=args.audit_seconds),
        metrics_port=args.metrics_port, pod=args.pod)

    async def main() -> int:
        client = await make_api_client(args.kubeconfig)  # UsageError names a bad kubeconfig
        try:
            await until_signalled(Agent(config, discoverer, KubeApi(client), events_nvml).run())
        finally:
            await client.close()
        return 0

    return asyncio.run(main())
