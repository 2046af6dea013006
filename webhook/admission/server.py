"""`muster serve`: wires certificates, policies, cluster context and the app, and runs them."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from webhook import atomicfile
from webhook.admission.admit import AdmissionConfig, Admitter, ClusterContext, UserAssignment
from webhook.admission.app import BodyLimits, build_app, build_metrics_app
from webhook.admission.limits import READ_BUFFER, ConnectionGuard, GuardedSite
from webhook.admission.metrics import Metrics
from webhook.admission.reload import PolicyStore, refusal_note
from webhook.admission.slots import SlotLimits
from webhook.admission.tls import CertReloader
from webhook.certs import (
    generate_ca,
    issue_serving_cert,
    service_dns_names,
    write_pair,
)
from webhook.certs.pki import LOCAL_IPS
from webhook.policy import PolicyError, PolicySet, load_policies

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

    from webhook.kube import EventRecorder, KubeApi

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    policies: list[Path]
    host: str = "0.0.0.0"
    port: int = 8443
    #: /metrics over plain HTTP on this port (0: any free one); None: no metrics endpoint
    metrics_port: int | None = None
    #: "127.0.0.1" keeps the metrics to the pod (a sidecar scraper, `kubectl port-forward`)
    metrics_host: str = "0.0.0.0"
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    self_signed: bool = False
    self_signed_dir: Path | None = None
    kubeconfig: str | None = None
    cert_mode: str = "files"
    service_name: str = "muster-webhook"
    namespace: str = "muster-system"
    on_user_assignment: UserAssignment = "strip"
    #: what one client may hold (docs/webhook.md, "Limits"); the defaults keep a server with
    #: large caches (130 MiB) inside the chart's 256 MiB memory limit with every connection
    #: sending a body and the body budget in use
    max_body_bytes: int = BodyLimits.max_bytes
    body_timeout: float = BodyLimits.timeout
    max_inflight_body_bytes: int = BodyLimits.in_flight
    header_timeout: float = 10.0
    #: above kube-apiserver's 90 s idle (Go's client does not resend a POST that met the
    #: server's close, so a shorter one fails a call open now and then); what idle clients
    #: hold is bounded by eviction instead: at the cap the connection idle longest is closed
    idle_timeout: float = 120.0
    max_connections: int = 128
    #: connections one client address may hold; past it, it displaces its own oldest waiting
    #: connection. Half the slots: kube-apiserver opens one per concurrent call
    max_connections_per_source: int = 64
    #: slots that connections not yet served (handshake, first headers) may not take
    reserved_connections: int = 32
    #: the metrics port's slots (a scraper uses one); a source holds half, a quarter reserved
    metrics_max_connections: int = 16
    exclude_namespaces: list[str] = field(default_factory=list)
    policies_configmap: str = "muster-policies"
    policy_poll_interval: float = 2.0
    cert_poll_interval: float = 2.0
    owner_cache_ttl: float = 5.0
    owner_retry_seconds: float = 60.0
    #: seconds between PodGroup cleanup rounds (finished jobs' PodGroups); 0: off
    podgroup_cleanup_interval: float = 30.0
    deadline_margin: float = 0.5
    shutdown_timeout: float = 5.0
    #: self mode: webhook configurations whose caBundle the manager keeps current
    webhook_configurations: list[str] = field(default_factory=list)
    cert_manager_interval: float = 3600.0
    #: seconds to wait at start for certificate files that are not there yet
    cert_wait: float = 0.0


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def policy_problems(exc: Exception) -> int:
    """Every problem of a refused load, those the error does not list included."""
    return exc.problem_count if isinstance(exc, PolicyError) else len(str(exc).splitlines())


def _self_signed_pair(opts: ServeOptions, out: Path) -> tuple[Path, Path]:
    """A fresh CA and serving certificate for local use; ca.crt is written for clients."""
    ca = generate_ca("muster-webhook-ca", days=365)
    pair = issue_serving_cert(ca, service_dns_names(opts.service_name, opts.namespace),
                              LOCAL_IPS, days=365)
    write_pair(pair, out / "tls.crt", out / "tls.key")
    # last and whole: a client that waits for ca.crt (the CLI test) finds everything in place
    atomicfile.write(out / "ca.crt", ca.cert_pem)
    log.info("self-signed serving certificate written", extra={"dir": str(out)})
    return out / "tls.crt", out / "tls.key"


class WebhookServer:
    """The running server; `async with WebhookServer(opts) as srv:` in tests, `run()` in the CLI."""

    def __init__(self, opts: ServeOptions) -> None:
        self.opts = opts
        self.metrics = Metrics()
        self.port = opts.port
        #: the metrics port bound (the one asked for, or the free one for 0); None when off
        self.metrics_port: int | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None
        self._client: ApiClient | None = None
        self.context: ClusterContext | None = None
        self.policy_store: PolicyStore[PolicySet] = PolicyStore(
            opts.policies, load_policies, error_types=(PolicyError,), metrics=self.metrics,
            count=len, on_refused=self._policy_refused, problems=policy_problems)
        self._events: EventRecorder | None = None
        self._admitter: Admitter | None = None
        #: the temporary directory of --self-signed's files, when the server made one
        self._scratch: Path | None = None

    @property
    def admitter(self) -> Admitter:
        if self._admitter is None:
            raise RuntimeError("the server is not started")
        return self._admitter

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        if self.metrics_port is None:
            raise RuntimeError("the server serves no metrics (no metrics_port)")
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def _spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def _policy_refused(self, message: str, problems: int) -> None:
        if self._events is None:
            return
        from webhook.admission.context import policies_configmap_ref  # noqa: PLC0415

        obj = await policies_configmap_ref(self._events.api, self.opts.namespace,
                                           self.opts.policies_configmap)
        await self._events.emit(obj, "Warning", "PolicyUpdateRefused",
                                refusal_note(message, problems))

    async def _tls(self) -> CertReloader:
        opts = self.opts
        if opts.self_signed:
            out = opts.self_signed_dir
            if out is None:  # stop() removes it: the key must not outlive the server in /tmp
                out = self._scratch = Path(tempfile.mkdtemp(prefix="muster-serve-"))
            cert, key = await asyncio.to_thread(_self_signed_pair, opts, out)
        elif opts.tls_cert_file and opts.tls_key_file:
            cert, key = opts.tls_cert_file, opts.tls_key_file
        else:
            raise ValueError("give --tls-cert-file and --tls-key-file, or --self-signed")
        # A freshly created Secret reaches its volume after a kubelet sync: wait for it a while.
        for _ in range(int(opts.cert_wait * 2)):
            if cert.exists() and key.exists():
                break
            await asyncio.sleep(0.5)
        return CertReloader(cert, key, self.metrics)

    async def _cluster(self) -> None:
        opts = self.opts
        if opts.kubeconfig is None and not in_cluster():
            log.warning("no cluster context (no --kubeconfig, not in a cluster): namespace "
                        "labels unknown, owners not looked up, PodGroups not created")
            return
        # The Kubernetes client is imported only when there is a cluster to talk to.
        from webhook.admission.context import KubeContext  # noqa: PLC0415
        from webhook.kube import EventRecorder, KubeApi, make_api_client  # noqa: PLC0415

        self._client = await make_api_client(opts.kubeconfig)
        api = KubeApi(self._client)
        self._events = EventRecorder(api, "muster-webhook", os.environ.get("HOSTNAME", "local"))
        context = KubeContext(api, self.metrics, owner_ttl=opts.owner_cache_ttl,
                              recorder=self._events)
        self.context = context
        self._spawn("cluster-context", context.run())
        if opts.podgroup_cleanup_interval > 0:
            self._spawn("podgroup-cleanup", self._cleanup(api))
        if opts.cert_mode == "self":
            await self._self_certs(api)

    async def _cleanup(self, api: KubeApi) -> None:
        """The PodGroup janitor, on one replica at a time (Lease)."""
        from webhook.admission.cleanup import PodGroupJanitor  # noqa: PLC0415
        from webhook.kube.leader import LeaderElector, LeaseConfig  # noqa: PLC0415

        janitor = PodGroupJanitor(api, self.metrics, self._events,
                                  self.opts.podgroup_cleanup_interval)
        identity = f"{os.environ.get('HOSTNAME', 'local')}_{os.getpid()}"
        lease = LeaseConfig(f"{self.opts.service_name}-podgroup-cleanup", self.opts.namespace,
                            identity)
        await LeaderElector(api, lease).run(janitor.run)

    async def _self_certs(self, api: KubeApi) -> None:
        """`--cert-mode self`: keep Muster's CA, serving Secret and caBundles current in-process.
        The serving Secret is mounted at --tls-cert-file/--tls-key-file; the kubelet updates
        the files and the CertReloader picks them up."""
        from webhook.certs.manager import (  # noqa: PLC0415
            CertManagerError,
            SelfCertConfig,
            SelfCertManager,
        )

        names = tuple(self.opts.webhook_configurations)
        manager = SelfCertManager(api, SelfCertConfig.for_service(
            self.opts.service_name, self.opts.namespace,
            mutating_webhook_configurations=names, validating_webhook_configurations=names))
        try:
            await manager.reconcile_once()
        except CertManagerError as exc:
            log.warning("certificate reconcile failed at start", extra={"error": str(exc)})
        self._spawn("cert-manager", manager.run(self.opts.cert_manager_interval))

    async def start(self) -> None:
        opts = self.opts
        await self._cluster()
        reloader = await self._tls()
        await self.policy_store.reload()
        excluded = frozenset(opts.exclude_namespaces) | {opts.namespace}
        self._admitter = Admitter(
            AdmissionConfig(opts.on_user_assignment, excluded, opts.deadline_margin,
                            opts.owner_retry_seconds),
            self.policy_store, self.context, self.metrics)
        guard = ConnectionGuard(
            reloader.context, SlotLimits(opts.max_connections, opts.max_connections_per_source,
                                         opts.reserved_connections),
            header_timeout=opts.header_timeout, metrics=self.metrics, listener="admission")
        app = build_app(self._admitter, self.metrics, BodyLimits(
            opts.max_body_bytes, opts.body_timeout, opts.max_inflight_body_bytes),
            track=guard.track)
        # lingering: after an answer sent before its body was read (413, 415, 408), the rest
        # of the body is read and dropped this long so that the client sees the answer
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=opts.shutdown_timeout,
                                     keepalive_timeout=opts.idle_timeout, lingering_time=2.0,
                                     read_bufsize=READ_BUFFER)
        await self._runner.setup()
        site = GuardedSite(self._runner, opts.host, opts.port, guard=guard, backlog=1024)
        await site.start()
        if opts.port == 0:
            self.port = int(self._runner.addresses[0][1])
        self._spawn("cert-reload", reloader.run(opts.cert_poll_interval))
        self._spawn("policy-reload", self.policy_store.run(opts.policy_poll_interval))
        log.info("muster webhook serving", extra={"host": opts.host, "port": self.port})
        if opts.metrics_port is not None:
            await self._serve_metrics(opts.metrics_host, opts.metrics_port)

    async def _serve_metrics(self, host: str, port: int) -> None:
        """Plain HTTP, behind the same guard as the admission port: its own slots, the same
        header and idle timeouts."""
        slots = self.opts.metrics_max_connections
        guard = ConnectionGuard(
            None, SlotLimits(slots, max(1, slots // 2), slots // 4),
            header_timeout=self.opts.header_timeout, metrics=self.metrics, listener="metrics")
        runner = web.AppRunner(build_metrics_app(self.metrics, track=guard.track),
                               access_log=None, handle_signals=False, shutdown_timeout=1.0,
                               keepalive_timeout=self.opts.idle_timeout)
        await runner.setup()
        self._metrics_runner = runner
        await GuardedSite(runner, host, port, guard=guard, backlog=128).start()
        self.metrics_port = int(runner.addresses[0][1]) if port == 0 else port
        log.info("metrics listening", extra={"host": host, "port": self.metrics_port})

    async def stop(self) -> None:
        """Finish in-flight requests and PodGroup writes, then stop watches and the client."""
        if self._admitter is not None:
            self._admitter.draining = True
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
            self._metrics_runner = None
        if self._admitter is not None:
            await self._admitter.drain(self.opts.shutdown_timeout)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    async def __aenter__(self) -> WebhookServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def run(opts: ServeOptions) -> None:
    server = WebhookServer(opts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except BaseException:
        await server.stop()  # what it started, and the files it wrote, go
        raise
    freeze = asyncio.create_task(_freeze_when_ready(server.admitter))
    try:
        await stop.wait()
        log.info("shutting down")
        # /readyz fails from now on, so the Service stops sending requests while those in
        # flight finish (the chart's preStop delay covers endpoint propagation)
        server.admitter.draining = True
    finally:
        freeze.cancel()
        await server.stop()


async def _freeze_when_ready(admitter: Admitter) -> None:
    """Once policies and caches are loaded, move them out of the cyclic GC's way: full
    collections then scan only what requests allocate, not the whole heap (fewer latency
    spikes). Objects are still freed by reference counting."""
    for _ in range(600):  # five minutes at most: afterwards freeze what there is
        if admitter.ready():
            break
        await asyncio.sleep(0.5)
    gc.freeze()
    log.debug("startup heap frozen for the garbage collector",
              extra={"objects": gc.get_freeze_count()})
