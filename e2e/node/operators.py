"""The job operators whose pods Muster gangs, built from the Go module proxy at the releases pinned
in `e2e.node.versions`, into `~/.cache/muster/<name>/<version>/`, and run for real beside a test
cluster.

- Each `Operator` is a recipe: module, release, the main package, where its CRDs and webhook
  configurations live inside the module (read at test time from the Go module cache: nothing
  upstream is kept here).
- `running()` starts one as a process in the test's network namespace (the calling thread must
  be inside it), with the cluster's kubeconfig, and ends it (by its pid) when the test is done.
- Operators built on controller-runtime serve admission webhooks that set defaults and labels the
  controllers rely on: they are served on loopback inside the cluster's network namespace, where
  the API server runs too, with a serving certificate from Muster's own `webhook.certs.pki`, and
  the operator's own webhook configurations are applied with `clientConfig.url` pointing there.

Run as `python -m e2e.node.operators [NAME ... | all]`; it prints each directory and the cold
build time.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.node import versions
from e2e.node.gobuild import _go, _go_env, build_module
from e2e.node.yamldocs import documents
from webhook.certs import pki

_PR_SET_PDEATHSIG = 1
#: the line `running` writes before each start: a log holds every run of a test session
_STARTED = "=== muster test: started with"


@dataclass(frozen=True)
class Operator:
    """How to build, install and run one operator."""

    name: str  #: the cache directory
    binary: str
    module: str
    version: str
    package: str  #: the main package
    crd_dir: str  #: the folder of its CRDs inside the module
    #: the file of its webhook configurations inside the module ("" when it serves none)
    webhooks: str = ""
    #: kustomize JSON patches of those (the pod webhooks' objectSelector), inside the module
    webhook_patches: tuple[str, ...] = ()
    #: the apiVersion of its controller-runtime Configuration file ("" when it takes none)
    config_api: str = ""
    #: CRD files of the module not to install (another operator owns that kind)
    crd_skip: tuple[str, ...] = ()
    #: flags that switch off its leader election and metrics server (those it has)
    flags: tuple[str, ...] = ()
    #: its Configuration's key for certificate rotation; whether it names a certificate folder
    #: (else controller-runtime's default under $TMPDIR)
    cert_rotation_key: str = "internalCertManagement"
    cert_dir_in_config: bool = True
    pin: Mapping[str, str] = field(default_factory=dict)


MPI_OPERATOR = Operator(
    "mpi-operator", "mpi-operator", "github.com/kubeflow/mpi-operator", versions.MPI_OPERATOR,
    "github.com/kubeflow/mpi-operator/cmd/mpi-operator", "manifests/base")
JOBSET = Operator(
    "jobset", "jobset-controller", "sigs.k8s.io/jobset", versions.JOBSET, "sigs.k8s.io/jobset",
    "config/components/crd/bases", "config/components/webhook/manifests.yaml",
    ("config/components/webhook/patches/mutating-patch.yaml",
     "config/components/webhook/patches/validating-patch.yaml"),
    "config.jobset.x-k8s.io/v1alpha1",
    flags=("--leader-elect=false", "--metrics-bind-address=0"))
LWS = Operator(
    "lws", "lws-controller", "sigs.k8s.io/lws", versions.LWS, "sigs.k8s.io/lws/cmd",
    "config/crd/bases",
    "config/webhook/manifests.yaml",
    ("config/webhook/mutating-patch.yaml", "config/webhook/validating-patch.yaml"),
    "config.lws.x-k8s.io/v1alpha1",
    flags=("--leader-elect=false", "--metrics-bind-address=0"))
#: the v1 operator (PyTorchJob...). Its MPIJob CRD is v1, the one mpi-operator v2 replaced: skipped
TRAINING_OPERATOR = Operator(
    "training-operator", "training-operator", "github.com/kubeflow/training-operator",
    versions.TRAINING_OPERATOR, "github.com/kubeflow/training-operator/cmd/training-operator.v1",
    "manifests/base/crds", "manifests/base/webhook/manifests.yaml",
    crd_skip=("kubeflow.org_mpijobs.yaml",))
#: Kubeflow Trainer v2 (TrainJob -> JobSet): needs JobSet's controller running too
TRAINER = Operator(
    "trainer", "trainer-controller-manager", "github.com/kubeflow/trainer/v2", versions.TRAINER,
    "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager", "manifests/base/crds",
    "manifests/base/webhook/manifests.yaml", config_api="config.trainer.kubeflow.org/v1alpha1",
    cert_rotation_key="certManagement", cert_dir_in_config=False)
OPERATORS = {op.name: op for op in (MPI_OPERATOR, JOBSET, LWS, TRAINING_OPERATOR, TRAINER)}


def build(op: Operator) -> Path:
    """The operator's binary, built once into the cache."""
    dest = build_module(op.name, op.module, op.version, {op.binary: op.package},
                        pin=dict(op.pin))
    return dest / op.binary


def module_dir(op: Operator) -> Path:
    """The operator's module as the Go module cache holds it (downloaded through the proxy)."""
    with tempfile.TemporaryDirectory(prefix="muster-opmod-") as tmp:
        work = Path(tmp)
        (work / "go.mod").write_text("module muster.local/probe\n\ngo 1.26\n")
        out = _go(["mod", "download", "-json", f"{op.module}@{op.version}"], work, _go_env())
    return Path(json.loads(out.stdout)["Dir"])


def crds(op: Operator, root: Path) -> list[dict[str, Any]]:
    """The operator's own CRDs, from its module at `root` (`module_dir`)."""
    docs = [d for p in sorted((root / op.crd_dir).glob("*.yaml"))
            if p.name not in op.crd_skip
            for d in documents(p.read_text()) if d.get("kind") == "CustomResourceDefinition"]
    if not docs:
        raise RuntimeError(f"{op.module}@{op.version} has no CRDs under {op.crd_dir}")
    return docs


def webhook_configurations(op: Operator, root: Path, url: str, ca_bundle: bytes, prefix: str
                           ) -> list[dict[str, Any]]:
    """The operator's own webhook configurations (its module at `root`) with its kustomize
    patches applied, each webhook sent to `url` + its service path (the operator on loopback,
    beside the API server) instead of its in-cluster Service, and named with `prefix` so that
    removing them takes only these."""
    docs = documents((root / op.webhooks).read_text())
    hooks = {h["name"]: (doc, i) for doc in docs for i, h in enumerate(doc.get("webhooks") or [])}
    for patch in op.webhook_patches:
        for step in yaml.safe_load((root / patch).read_text()):
            value = step.get("value") or {}
            if step.get("op") != "replace" or value.get("name") not in hooks:
                raise RuntimeError(f"{op.module}@{op.version} {patch}: {step.get('op')} of "
                                   f"{value.get('name')!r} does not replace one of its webhooks")
            doc, i = hooks[value["name"]]
            doc["webhooks"][i] = value
    ca = base64.b64encode(ca_bundle).decode()
    for doc in docs:
        doc["metadata"] = {"name": f"{prefix}{doc['metadata']['name']}"}
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca}
    return docs


def service_webhook_configuration(op: Operator, root: Path, name: str,
                                  service: tuple[str, str, int], keep: str) -> dict[str, Any]:
    """The operator's one webhook configuration (its module at `root`; the file holds one)
    named `name`, as its kustomize overlay names it, with the webhooks whose name holds `keep`,
    sent to the Service (namespace, name, port) that its own certificate rotation signs for."""
    (doc,) = documents((root / op.webhooks).read_text())
    doc["metadata"] = {"name": name}
    doc["webhooks"] = [h for h in doc["webhooks"] if keep in h["name"]]
    if not doc["webhooks"]:
        raise RuntimeError(f"{op.module}@{op.version} {op.webhooks} has no webhook for {keep}")
    ns, svc, port = service
    for hook in doc["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"service": {"namespace": ns, "name": svc, "port": port,
                                            "path": path}}
    return doc


@dataclass(frozen=True)
class Serving:
    """Where a controller-runtime operator serves its webhooks: loopback in the cluster's
    network namespace (the API server's too), with a certificate of its own CA."""

    port: int
    cert_dir: Path
    ca_pem: bytes

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def serving(tmp: Path, port: int) -> Serving:
    """A CA and a serving certificate for 127.0.0.1 in `tmp`/k8s-webhook-server/serving-certs
    (tls.crt, tls.key: controller-runtime's default folder and names, with $TMPDIR=`tmp`)."""
    cert_dir = tmp / "k8s-webhook-server" / "serving-certs"
    ca = pki.generate_ca("muster-test-operator-ca", days=2)
    pair = pki.issue_serving_cert(ca, ["localhost"], ["127.0.0.1"], days=2)
    cert_dir.mkdir(parents=True, exist_ok=True)
    pki.write_pair(pair, cert_dir / "tls.crt", cert_dir / "tls.key")
    return Serving(port, cert_dir, ca.cert_pem)


def manager_config(op: Operator, where: Serving) -> dict[str, Any]:
    """The operator's Configuration: webhooks on `where`, no certificate rotation of its own
    (it would want an in-cluster Service and Secret), no leader election (one replica), no
    metrics server, health probes on loopback."""
    if not op.config_api:
        raise RuntimeError(f"{op.name} takes no controller-runtime Configuration")
    webhook: dict[str, Any] = {"port": where.port, "host": "127.0.0.1"}
    if op.cert_dir_in_config:
        webhook["certDir"] = str(where.cert_dir)
    return {"apiVersion": op.config_api, "kind": "Configuration",
            op.cert_rotation_key: {"enable": False},
            "leaderElection": {"leaderElect": False},
            "webhook": webhook,
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{where.port + 1}"}}


def _die_with_parent() -> None:
    import ctypes  # noqa: PLC0415 - only in the child before exec

    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def running(binary: Path, args: list[str], log: Path, *, env: Mapping[str, str] | None = None,
            private_dir: str = "") -> Iterator[subprocess.Popen[bytes]]:
    """The operator running with `args`, its output in `log`, until the block ends (terminated
    by its pid). Call it with the thread inside the cluster's network namespace: the process
    stays there. `private_dir`: a fixed host path the operator writes (a certificate folder it
    does not let one move) becomes a tmpfs of its own mount namespace, reached from outside as
    `/proc/<pid>/root/<path>`, so nothing of it lands on the host."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(binary), *args]
    if private_dir:
        Path(private_dir).mkdir(parents=True, exist_ok=True)  # the mount point, left empty
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               f'mount -t tmpfs -o mode=0700 tmpfs {private_dir} && exec "$0" "$@"', *cmd]
    with log.open("ab") as out:
        out.write(f"{_STARTED} {' '.join(args)}\n".encode())  # wait_ready reads from here
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                                preexec_fn=_die_with_parent)  # noqa: PLW1509 - prctl only
    try:
        yield proc
        if proc.poll() is not None:
            raise RuntimeError(f"{binary.name} exited during the test ({proc.returncode}):\n"
                               f"{tail(log)}")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def private_path(proc: subprocess.Popen[bytes], binary: Path, path: str) -> Path:
    """Where `path` inside `running(..., private_dir=...)`'s tmpfs is reached from outside, once
    the process runs `binary` (so the tmpfs is mounted: a file written before would land on the
    host, under it)."""
    deadline = time.monotonic() + 30
    while os.readlink(f"/proc/{proc.pid}/exe") != str(binary):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{binary.name} did not start (exit status {proc.poll()})")
        time.sleep(0.05)
    return Path(f"/proc/{proc.pid}/root{path}")


def wait_ready(proc: subprocess.Popen[bytes], log: Path, ready: Sequence[str],
               within: float = 90.0) -> None:
    """Until the operator's log, since its last start, holds each of `ready` (it has started its
    workers, serves its webhooks); an operator that exits first fails with its log."""
    deadline = time.monotonic() + within
    while not all(r in log.read_text(errors="replace").rsplit(_STARTED, 1)[-1] for r in ready):
        if proc.poll() is not None:
            raise RuntimeError(f"{log.stem} exited ({proc.returncode}):\n{tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{log.stem} did not log {list(ready)} within {within:g} s:\n"
                               f"{tail(log)}")
        time.sleep(0.2)


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.node.operators", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", default=["all"],
                        choices=(*OPERATORS, "all"))
    args = parser.parse_args(argv)
    names = list(OPERATORS) if "all" in args.what else args.what
    try:
        for name in names:
            started = time.monotonic()
            path = build(OPERATORS[name])
            print(f"{path} ({time.monotonic() - started:.0f} s)")
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
