"""The schedulers Muster's output is proven against, built from the Go module proxy at the
releases pinned in `e2e.node.versions`, into `~/.cache/muster/<name>/<version>/`.

- scheduler-plugins (the coscheduling kube-scheduler): its go.mod replaces every `k8s.io/*`
  staging module with a `v0.34.7` the proxy refuses; the replaces are pinned to the staging
  versions of `k8s.io/kubernetes` `KUBERNETES_OLDEST` (1.34.4), whose cluster binaries the tier
  already builds. A 1.34 scheduler is only inside the supported version skew of a 1.34 API
  server, so its scenarios run on that cluster.
- Kueue: no replaces; `go build` of its manager as published.
- Volcano: its scheduler, controller-manager and webhook-manager at `VOLCANO` (v1.10.0), the
  newest release the proxy serves (each newer one, `VOLCANO_REFUSED`, is "403 not available");
  its go.mod's replaces are all published versions (`k8s.io/*` at v0.30.2), kept as they are.

Run as `python -m e2e.node.schedulers [coscheduling | kueue | volcano | all]`; it prints each
directory and the cold build time.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from e2e.node import versions
from e2e.node.cluster import die_with_parent
from e2e.node.gobuild import (
    _go,
    _go_env,
    build_module,
    cache_root,
    module_gomod,
    staging_modules,
)

COSCHEDULING_BINARY = "kube-scheduler"
#: the second scheduler's name, as scheduler-plugins' Helm chart names it (and the shipped
#: mpi-coscheduling policy)
COSCHEDULING_NAME = "scheduler-plugins-scheduler"
#: the plugin's podGroupRejectPercentage for the timeout scenario: when a member fails Filter,
#: its waiting siblings are rejected at once unless at most this share of the gang is unplaced
#: (default 10). At 100 they are never rejected early, so they hold their node until their
#: PodGroup's scheduleTimeoutSeconds: the timeout itself is what the scenario proves
COSCHEDULING_REJECT_PERCENTAGE = 100
#: the plugin requeues a gang its PreFilter refused (minResources not free) only on a pod add or
#: a PodGroup change; capacity that frees up is seen at the scheduler's flush of unschedulable
#: pods, 5 min by default: 20 s here (the flag is deprecated but still served in 1.34)
COSCHEDULING_FLAGS = ("--pod-max-in-unschedulable-pods-duration=20s",)
KUEUE_BINARY = "kueue-manager"
#: Volcano's three programs: binary -> package of volcano.sh/volcano
VOLCANO_BINARIES = {name: f"volcano.sh/volcano/cmd/{name}"
                    for name in ("scheduler", "controller-manager", "webhook-manager")}


def _staging_pins(kubernetes: str) -> dict[str, str]:
    """Each `k8s.io/*` staging module of `k8s.io/kubernetes@kubernetes` -> its published
    version, and `k8s.io/kubernetes` itself."""
    with tempfile.TemporaryDirectory(prefix="muster-staging-") as tmp:
        work = Path(tmp)
        (work / "go.mod").write_text("module muster.local/probe\n\ngo 1.26\n")
        _, replaces = module_gomod("k8s.io/kubernetes", kubernetes, _go_env(), work)
        mods = staging_modules(replaces)
    staging = "v0." + kubernetes.removeprefix("v1.")
    return {**dict.fromkeys(mods, staging), "k8s.io/kubernetes": kubernetes}


def build_coscheduling() -> Path:
    """The scheduler-plugins kube-scheduler (coscheduling among its plugins)."""
    dest = cache_root() / "scheduler-plugins" / versions.SCHEDULER_PLUGINS
    if (dest / COSCHEDULING_BINARY).exists():
        return dest / COSCHEDULING_BINARY
    build_module("scheduler-plugins", "sigs.k8s.io/scheduler-plugins",
                 versions.SCHEDULER_PLUGINS,
                 {COSCHEDULING_BINARY: "sigs.k8s.io/scheduler-plugins/cmd/scheduler"},
                 pin=_staging_pins(versions.SCHEDULER_PLUGINS_KUBERNETES))
    return dest / COSCHEDULING_BINARY


def build_kueue() -> Path:
    """Kueue's controller manager (its webhooks in the same process)."""
    dest = build_module("kueue", "sigs.k8s.io/kueue", versions.KUEUE,
                        {KUEUE_BINARY: "sigs.k8s.io/kueue/cmd/kueue"})
    return dest / KUEUE_BINARY


def build_volcano() -> Path:
    """The directory holding Volcano's scheduler, controller-manager and webhook-manager."""
    return build_module("volcano", "volcano.sh/volcano", versions.VOLCANO, VOLCANO_BINARIES)


def coscheduling_config(kubeconfig: Path, scheduler_name: str, *, qps: int | None = None,
                        reject_percentage: int = 10) -> dict[str, Any]:
    """The KubeSchedulerConfiguration of a second scheduler `scheduler_name` whose only
    profile has the coscheduling plugin (as scheduler-plugins' own
    manifests/coscheduling/scheduler-config.yaml); `qps` is the client's QPS and burst (the
    binary's default is 50/100). `reject_percentage` is the plugin's
    podGroupRejectPercentage: when a gang's unplaced share is at most this, a pod that fails
    does not reject its waiting siblings, so they wait out their PodGroup's timeout."""
    connection: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
    if qps is not None:
        connection |= {"qps": qps, "burst": qps}
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False}, "clientConnection": connection,
        "profiles": [{
            "schedulerName": scheduler_name,
            "plugins": {"multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                        "queueSort": {"enabled": [{"name": "Coscheduling"}],
                                      "disabled": [{"name": "*"}]}},
            "pluginConfig": [{"name": "Coscheduling", "args": {
                "permitWaitingTimeSeconds": 60,
                "podGroupRejectPercentage": reject_percentage}}]}]}


class Neighbour:
    """One upstream program run as a process beside the test's cluster (in the network
    namespace of the thread that starts it), its output in `log`; it dies with the test
    process."""

    def __init__(self, name: str, argv: list[str], log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.log = name, log
        out: IO[bytes] = log.open("ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, env=env,
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent)  # noqa: PLW1509 - only prctl
        out.close()

    def alive(self) -> str | None:
        """Why the process is gone, or None while it runs."""
        code = self.proc.poll()
        return None if code is None else f"{self.name} exited with {code}:\n{self.tail()}"

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def module_dir(module: str, version: str) -> Path:
    """Where the Go module cache holds `module@version`'s files (downloaded through the proxy
    if missing): CRDs and webhook manifests are read from there at test time."""
    with tempfile.TemporaryDirectory(prefix="muster-moddir-") as tmp:
        work = Path(tmp)
        (work / "go.mod").write_text("module muster.local/probe\n\ngo 1.26\n")
        out = _go(["mod", "download", "-json", f"{module}@{version}"], work, _go_env())
    return Path(json.loads(out.stdout)["Dir"])


#: the Kueue integrations the tier runs (no operator needed for either: the tests create an
#: MPIJob's pods as the MPI operator would)
KUEUE_FRAMEWORKS = ("batch/job", "kubeflow.org/mpijob")
#: the webhook paths kept, of the integrations above and Kueue's own kinds
_KUEUE_PATHS = ("-batch-v1-job", "-kubeflow-org-v2beta1-mpijob", "-kueue-x-k8s-io-")


KUEUE_NAMESPACE = "kueue-system"
#: Kueue's own certificate manager names the Service its certificate is for, and the webhook
#: configurations (`kueue-{mutating,validating}-webhook-configuration`) it writes the CA into
KUEUE_SERVICE = "kueue-webhook-service"
#: the CRDs Kueue converts between API versions (its kustomize patches give them a conversion
#: webhook; its certificate manager writes the CA into each)
KUEUE_CONVERTED = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")


def kueue_config(*, host: str, port: int, cert_dir: Path, health: str,
                 pods_ready_timeout: str) -> dict[str, Any]:
    """Kueue's Configuration for a manager run outside the cluster: no leader election, no
    metrics, its webhook server on `host:port` (a selector-less Service `KUEUE_SERVICE` points
    there) with the certificate its own manager makes into `cert_dir`, and waitForPodsReady with
    `pods_ready_timeout`. (Without its certificate manager Kueue wants a metrics certificate at
    the fixed path /etc/kueue/metrics/certs.)"""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE, "health": {"healthProbeBindAddress": health},
        "metrics": {"bindAddress": "0"}, "leaderElection": {"leaderElect": False},
        "webhook": {"host": host, "port": port, "certDir": str(cert_dir)},
        "internalCertManagement": {"enable": True, "webhookServiceName": KUEUE_SERVICE},
        "waitForPodsReady": {"timeout": pods_ready_timeout, "blockAdmission": False},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)}}


def kueue_crd(crd: dict[str, Any]) -> dict[str, Any]:
    """Kueue's CRD as its kustomize patches install it: the converted ones call its webhook."""
    if crd["spec"]["names"]["plural"] not in KUEUE_CONVERTED:
        return crd
    return {**crd, "spec": {**crd["spec"], "conversion": {"strategy": "Webhook", "webhook": {
        "clientConfig": {"service": {"namespace": KUEUE_NAMESPACE, "name": KUEUE_SERVICE,
                                     "path": "/convert"}},
        "conversionReviewVersions": ["v1"]}}}}


def endpoint_slice(namespace: str, service: str, port_name: str, address: str, port: int
                   ) -> dict[str, Any]:
    """The EndpointSlice of a Service without a selector: one Ready endpoint at `address:port`
    (a program beside the cluster). The API server's endpoint routing reads it (1.34 and 1.37
    resolve a webhook's Service by its slices, matching the Service port's name); written
    directly rather than as v1 Endpoints, deprecated since 1.33, for the mirroring controller."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": service, "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by": "muster-tests"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]}


def webhook_service(namespace: str, name: str, address: str, port: int
                    ) -> list[dict[str, Any]]:
    """A webhook's Service without a selector, and its EndpointSlice at `address:port`."""
    return [{"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
            endpoint_slice(namespace, name, "https", address, port)]


def kueue_service(address: str, port: int) -> list[dict[str, Any]]:
    """Kueue's webhook Service and EndpointSlice (`webhook_service`), and the empty Secret Kueue's
    certificate manager fills (config/components/internalcert: it updates the Secret, never
    creates it)."""
    return [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": "kueue-webhook-server-cert", "namespace": KUEUE_NAMESPACE}},
            *webhook_service(KUEUE_NAMESPACE, KUEUE_SERVICE, address, port)]


def kueue_webhooks(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kueue's own webhook configurations (config/components/webhook/manifests.yaml) with only
    the webhooks of `KUEUE_FRAMEWORKS` and Kueue's kinds, named and pointed at its Service as
    its kustomization does (Kueue writes the CA bundle in)."""
    out = []
    for doc in manifests:
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if any(part in path for part in _KUEUE_PATHS):
                hooks.append({**hook, "clientConfig": {"service": {
                    "namespace": KUEUE_NAMESPACE, "name": KUEUE_SERVICE, "path": path}}})
        if hooks:
            name = doc["metadata"]["name"]
            out.append({**doc, "metadata": {"name": f"kueue-{name}"}, "webhooks": hooks})
    return out


VOLCANO_NAMESPACE = "volcano-system"
#: the Helm release the chart's webhook configurations are rendered for: each calls Service
#: `<release>-admission-service`, and is named `volcano-admission-service-<path>`, the name the
#: webhook-manager looks for to write its CA bundle into
VOLCANO_RELEASE = "volcano"
VOLCANO_SERVICE = f"{VOLCANO_RELEASE}-admission-service"
#: Volcano's Helm chart inside its module: the CRDs, webhook configurations and the scheduler's
#: and admission's configuration files are read from there at test time
VOLCANO_CHART = Path("installer", "helm", "chart", "volcano")
#: where the scheduler and the controller-manager answer /healthz (both default to :11251)
VOLCANO_HEALTH = {"scheduler": "127.0.0.1:11251", "controller-manager": "127.0.0.1:11252"}


def volcano_crds(crds: list[dict[str, Any]], served: set[str]) -> list[dict[str, Any]]:
    """Volcano's CRDs that the cluster does not serve yet. The tier installs a newer Volcano's
    PodGroup and Queue (../shared/crds) whose schemas are a superset of 1.10's: they stay, so
    the scenarios after this neighbour still have every field Muster writes."""
    return [c for c in crds if c["metadata"]["name"] not in served]


def volcano_commands(bin_dir: Path, chart: Path, kubeconfig: Path, certs: Path, *,
                     address: str, port: int) -> dict[str, list[str]]:
    """Binary -> argv of Volcano's three programs as its chart's Deployments run them, outside
    the cluster: leader election off, health endpoints on loopback, and the webhook server on
    `address:port` (the EndpointSlice of `VOLCANO_SERVICE`) with the `certs` directory's
    ca.crt / tls.crt / tls.key. `chart` is `VOLCANO_CHART` in the module."""
    common = [f"--kubeconfig={kubeconfig}", "--logtostderr", "-v=4"]
    return {
        "scheduler": [str(bin_dir / "scheduler"), *common, "--leader-elect=false",
                      f"--scheduler-conf={chart / 'config' / 'volcano-scheduler.conf'}",
                      "--enable-healthz=true", f"--healthz-address={VOLCANO_HEALTH['scheduler']}"],
        "controller-manager": [str(bin_dir / "controller-manager"), *common,
                               "--leader-elect=false", "--enable-healthz=true",
                               f"--healthz-address={VOLCANO_HEALTH['controller-manager']}"],
        "webhook-manager": [str(bin_dir / "webhook-manager"), *common,
                            f"--admission-conf={chart / 'config' / 'volcano-admission.conf'}",
                            f"--webhook-namespace={VOLCANO_NAMESPACE}",
                            f"--webhook-service-name={VOLCANO_SERVICE}",
                            f"--listen-address={address}", f"--port={port}",
                            f"--ca-cert-file={certs / 'ca.crt'}",
                            f"--tls-cert-file={certs / 'tls.crt'}",
                            f"--tls-private-key-file={certs / 'tls.key'}"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.node.schedulers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("coscheduling", "kueue", "volcano", "all"), nargs="?",
                        default="all")
    args = parser.parse_args(argv)
    builds = {"coscheduling": build_coscheduling, "kueue": build_kueue,
              "volcano": build_volcano}
    try:
        for name, build in builds.items():
            if args.what in (name, "all"):
                started = time.monotonic()
                path = build()
                print(f"{name}: {path} ({time.monotonic() - started:.0f} s)")
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
