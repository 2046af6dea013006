"""`muster agent` (the node agent) and `muster agent discover` (print what NVML shows)."""

from __future__ import annotations

import argparse
import os

from webhook import keys


def _source_args(parser: argparse.ArgumentParser, *, sub: bool = False) -> None:
    # on `discover`, unset options must not hide the same options given before it
    # (`muster agent --node-type x discover`): argparse lets a subcommand's defaults win
    default: str | None = argparse.SUPPRESS if sub else None
    parser.add_argument("--fake-nvml", nargs="?", const="dgx1-v100", metavar="PROFILE|FILE",
                        default=default,
                        help="use the fake NVML: a built-in profile (dgx1-v100, dgx1-v100-r535, "
                             "hgx-a100, hgx-h100; default dgx1-v100) or a file recorded with "
                             "--record")
    parser.add_argument("--topology-file", metavar="FILE", default=default,
                        help="static topology (the node annotation's JSON) instead of NVML")
    parser.add_argument("--node-type", metavar="NAME", default=default,
                        help="built-in node type (e.g. dgx1-v100) instead of NVML")


def _own_pod() -> str | None:
    """This pod's keys.gpu_agent, from the downward API's variables, if all are set."""
    parts = [os.environ.get(n, "") for n in ("POD_NAMESPACE", "POD_NAME", "POD_UID")]
    return keys.gpu_agent(*parts) if all(parts) else None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = subparsers.add_parser(
        "agent", help="node agent: GPU topology discovery and the kubelet device plugin",
        description="Discover the node's GPU interconnect (NVML), publish it on the Node, and "
                    "serve the GPUs to the kubelet honouring the binder's assignment.")
    agent.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                       help="this node's name (default: $NODE_NAME)")
    agent.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, else $KUBECONFIG)")
    agent.add_argument("--pod", default=_own_pod(), metavar="NAMESPACE/NAME/UID",
                       help="this agent's pod, recorded on the Node at each registration: the "
                            "binder places GPU pods there only while it is Ready (default: "
                            "$POD_NAMESPACE/$POD_NAME/$POD_UID where all are set; the chart "
                            "sets them)")
    _source_args(agent)
    agent.add_argument("--kubelet-dir", default="/var/lib/kubelet/device-plugins",
                       help="the kubelet's device plugin directory")
    agent.add_argument("--resource-name", default=keys.GPU_RESOURCE,
                       help="extended resource the plugin registers (default nvidia.com/gpu)")
    agent.add_argument("--cdi", action="store_true",
                       help="also hand out CDI device names (nvidia.com/gpu=<uuid>)")
    agent.add_argument("--device-plugin", action=argparse.BooleanOptionalAction, default=True,
                       help="serve the GPUs through the kubelet device plugin (default on)")
    agent.add_argument("--dra", action="store_true",
                       help=f"also be the DRA driver {keys.DRA_DRIVER}: publish this node's "
                            "ResourceSlice and prepare claims as CDI specs (Kubernetes 1.34+)")
    agent.add_argument("--dra-registry-dir", default="/var/lib/kubelet/plugins_registry",
                       help="the kubelet's plugin registration directory")
    agent.add_argument("--dra-plugin-dir", default=f"/var/lib/kubelet/plugins/{keys.DRA_DRIVER}",
                       help="where the DRA socket and the prepared-claims checkpoint live")
    agent.add_argument("--cdi-dir", default="/var/run/cdi",
                       help="where the DRA driver writes the CDI spec of each prepared claim")
    agent.add_argument("--rediscover-seconds", type=float, default=60.0,
                       help="re-run discovery and re-publish on change this often")
    agent.add_argument("--assignment-wait-seconds", type=float, default=10.0,
                       help="how long Allocate waits for the pod's GPU assignment")
    agent.add_argument("--ack-grace-seconds", type=float, default=10.0,
                       help="the Node's muster.io/gpu-allocation-ack label goes when the device "
                            "plugin has not been registered with the kubelet for this long "
                            "(default 10: a kubelet restart does not remove it)")
    agent.add_argument("--pod-resources-socket",
                       default="/var/lib/kubelet/pod-resources/kubelet.sock",
                       help="the kubelet's PodResources API: what each pod holds is checked "
                            "against the binder's assignments (\"\": no check)")
    agent.add_argument("--audit-seconds", type=float, default=60.0,
                       help="check every pod's GPUs through PodResources this often")
    agent.add_argument("--metrics-port", type=int, default=None,
                       help="serve /metrics and /healthz on this port")
    agent.add_argument("--unassigned", choices=["error", "kubelet"], default="error",
                       help="a container without assignment: refuse it (error) or give it the "
                            "kubelet's pick (kubelet)")
    agent.add_argument("--scheduler-name", default=keys.DEFAULT_BINDER_SCHEDULER_NAME,
                       help="the binder's scheduler name: GPU assignments count only on pods "
                            "with this spec.schedulerName (default muster-binder)")
    agent.set_defaults(func=_run)
    sub = agent.add_subparsers(dest="agent_command", metavar="SUBCOMMAND")
    disc = sub.add_parser("discover", help="print the discovered topology as JSON",
                          description="Run discovery once and print the topology JSON, "
                                      "degradations and class hash.")
    _source_args(disc, sub=True)
    disc.add_argument("--record", metavar="FILE",
                      help="also write what NVML answered to FILE (replayable with --fake-nvml)")
    disc.add_argument("--keep-uuids", action="store_true",
                      help="record real GPU UUIDs (default: anonymised)")
    disc.set_defaults(func=_discover)


def _discover(args: argparse.Namespace) -> int:
    from webhook.agent import commands  # noqa: PLC0415 (keep the CLI light)

    return commands.discover(args)


def _run(args: argparse.Namespace) -> int:
    from webhook.agent import commands  # noqa: PLC0415

    return commands.run(args)
