"""What `muster analyze` finds: pure checks over a snapshot of the cluster.

Muster's failures are quiet (a pod that waits forever), so each check names a misconfiguration
before users meet it, with a severity, the object and the fix. `collect.py` reads the cluster
into a `Snapshot`; everything here is a function of it (and of `now`, for expiry).
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from webhook import keys
from webhook.analyze.gangstate import advice, scheduled_message, wait_kind
from webhook.binder.agents import AgentPod, agent_wait, parse_agent
from webhook.binder.evict import PREEMPTED, PREEMPTING
from webhook.binder.hypernodes import TIER_LABEL_PREFIX, HyperNodeView, Tiers
from webhook.binder.nodes import parse_node
from webhook.binder.pods import parse_pod
from webhook.binder.topologies import TopologyView
from webhook.kube.owners import controller_ref
from webhook.policy import native
from webhook.policy.audit import EVENT_REASON, read_event
from webhook.policy.cleanup import cleanup_reason
from webhook.policy.compiled import compile_policy, selector_matches
from webhook.policy.podgroup import made_by_muster
from webhook.policy.policyset import PolicySet, written_fields
from webhook.policy.queues import queue_problem, state_of
from webhook.policy.schema import SchedulingPolicy
from webhook.topology.network import Levels, TopologyRef

Severity = Literal["error", "warning", "info"]
Obj = Mapping[str, Any]
BACKEND_CRDS = {"volcano": "podgroups.scheduling.volcano.sh",
                "coscheduling": "podgroups.scheduling.x-k8s.io"}
ISTIO_INJECTOR = "istio-sidecar-injector"
HYPERNODE_CRD = "hypernodes.topology.volcano.sh"
KUEUE_CRD = "localqueues.kueue.x-k8s.io"
SAFE_EXCLUDED = ("kube-system",)


@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    code: str
    object: str  # kind/namespace/name, or kind/name
    message: str
    fix: str


@dataclass
class Snapshot:
    """What the checks read, as the API server returned it (plain dicts)."""

    namespace: str  # Muster's release namespace
    webhook_configuration: str  # the name the chart gives Muster's webhook configurations
    service: str  # the webhook Service
    binder_lease: str
    policies: PolicySet | None = None
    crds: frozenset[str] = frozenset()
    queues: Mapping[str, Obj] = field(default_factory=dict)
    mutating: Sequence[Obj] = ()
    #: the webhook Service's EndpointSlices (v1 Endpoints are deprecated since 1.33)
    endpoint_slices: Sequence[Obj] = ()
    serving_cert: bytes | None = None  # PEM of the webhook's serving certificate
    #: the Secret it came from (its Deployment's; `<service>-tls` where that cannot be read)
    serving_secret: str = ""
    nodes: Sequence[Obj] = ()
    podgroups: Sequence[tuple[str, Obj]] = ()  # (group/Kind of the owner, PodGroup)
    #: the native Workload API's apiVersion the cluster serves (`native.pick_api`), or None
    native_api: str | None = None
    jobs: Mapping[str, Obj] = field(default_factory=dict)  # uid -> job object
    leases: Mapping[str, Obj] = field(default_factory=dict)  # name -> Lease
    binder_deployed: bool = True
    #: the binder's network levels, whose aliases a policy may name (`--network-levels`)
    levels: Levels = field(default_factory=Levels)
    #: Volcano's HyperNodes, where they are the levels (None: not read, or their CRD missing)
    hypernodes: Sequence[Obj] | None = None
    #: the Topology object the binder's levels name (`kueue:NAME`, `kai:NAME`; None: not
    #: named, or not in the cluster)
    topology: Obj | None = None
    namespaces: Sequence[Obj] | None = None  # None: not read (no finding about matching)
    #: Kueue's resourceflavors, clusterqueues and localqueues, by plural (empty: not installed)
    kueue: Mapping[str, Sequence[Obj]] = field(default_factory=dict)
    #: unbound pods of the binder (schedulerName muster-binder)
    waiting_pods: Sequence[Obj] = ()
    #: unbound pods of the schedulers coscheduling policies name
    unscheduled_pods: Sequence[Obj] = ()
    #: a pod unbound this long with no PodScheduled condition has no scheduler looking at it
    stuck_after: float = 120.0
    #: the webhook's Events about what policies in audit or warn mode would do (all namespaces)
    audit_events: Sequence[Obj] = ()
    #: the binder's preemption Events (`GangPreempted`, `GangPreempting`; all namespaces)
    preemption_events: Sequence[Obj] = ()
    #: the pods the nodes' GPU-agent records name, where they exist, and every Muster agent
    #: pod of the release (None: not read, no finding about agents)
    agent_pods: Sequence[Obj] | None = None


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj.get('kind', '?')}/{ns + '/' if ns else ''}{meta.get('name', '?')}"


def analyze(s: Snapshot, now: dt.datetime) -> list[Finding]:
    checks = (_backends, _queues, _webhook_order, _webhook_safety, _endpoints, _ca_bundle,
              _gpu_nodes, _network, _podgroups, _binder, _matching,
              _shadowed, _waiting, _schedulers, _not_enforced, _beside_kueue_tas,
              _preemptions, _gpu_agents)
    out = [f for check in checks for f in check(s, now)]
    rank = {"error": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda f: (rank[f.severity], f.code, f.object))


def _gangs(s: Snapshot) -> Iterator[tuple[str, Any]]:
    for policy in s.policies.policies if s.policies else ():
        if policy.spec.gang is not None:
            yield f"SchedulingPolicy/{policy.name}", policy.spec.gang


def _backends(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    for where, gang in _gangs(s):
        crd = BACKEND_CRDS.get(gang.backend)
        if crd is not None and crd not in s.crds:
            yield Finding("error", "BackendNotInstalled", where,
                          f"gang backend {gang.backend} needs the {crd} CRD, which is not "
                          "installed: the PodGroup cannot be created and the pods never start",
                          f"install {gang.backend} (its CRDs), or change the policy's backend")
        if gang.backend == "kubernetes":
            yield _native_backend(s, where, gang.unavailableApi)


def _native_backend(s: Snapshot, where: str, unavailable: str) -> Finding:
    """A native gang's API: which shape the cluster serves, or what happens without one."""
    if s.native_api is not None:
        return Finding("info", "NativeGangs", where,
                       f"gang backend kubernetes: the cluster serves {s.native_api}; Muster "
                       "writes its Workload (and PodGroup) in that shape. kube-scheduler gangs "
                       "the pods only with feature gate GenericWorkload on, which the API "
                       "does not show", "check kube-scheduler's --feature-gates")
    then = ("its job's pods are refused" if unavailable == "Refuse"
            else "its job's pods are admitted without a gang")
    return Finding("error" if unavailable == "Refuse" else "warning", "WorkloadApiNotServed",
                   where, f"gang backend kubernetes needs the native Workload API "
                   f"({native.GROUP} {', '.join(native.VERSIONS)}), which this cluster does not "
                   f"serve: {then} (gang.unavailableApi {unavailable})",
                   "turn on feature gate GenericWorkload (API server and kube-scheduler) and "
                   "serve the version (--runtime-config), or change the policy's backend")


def _queues(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    if BACKEND_CRDS["volcano"] not in s.crds:
        return
    states = {name: state_of(queue) for name, queue in s.queues.items()}
    for where, gang in _gangs(s):
        if gang.backend != "volcano":
            continue
        for field_name, name in (("queue", gang.queue), ("fallbackQueue", gang.fallbackQueue)):
            problem = queue_problem(name, states) if name else None
            if problem:
                yield Finding("error" if field_name == "queue" else "warning", "QueueUnavailable",
                              where, f"gang.{field_name}: {problem}; its gangs "
                              + ("fall back or lose the gang" if field_name == "queue"
                                 else "cannot fall back there"),
                              f"create the queue (or open it), or change gang.{field_name}")
    for job in s.jobs.values():
        name = (job.get("metadata", {}).get("annotations") or {}).get(
            keys.VOLCANO_QUEUE_ANNOTATION)
        problem = queue_problem(name, states) if name else None
        if problem:
            yield Finding("warning", "QueueUnavailable", _name(job),
                          f"the job names {problem}", "create or open the queue, or change the "
                          f"job's {keys.VOLCANO_QUEUE_ANNOTATION}")


def _calls(hook: Obj, s: Snapshot) -> bool:
    service = (hook.get("clientConfig") or {}).get("service") or {}
    return bool(service.get("name") == s.service and service.get("namespace") == s.namespace)


def _ours(s: Snapshot) -> Obj | None:
    """Muster's mutating configuration: the one named as the chart names it, else one whose
    webhooks call Muster's Service (a `webhook.configurationNamePrefix` of the admin's)."""
    return next((c for c in s.mutating
                 if c.get("metadata", {}).get("name") == s.webhook_configuration), None) \
        or next((c for c in s.mutating if any(_calls(h, s) for h in c.get("webhooks") or ())),
                None)


def _webhook_order(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    ours = _ours(s)
    names = [c.get("metadata", {}).get("name", "") for c in s.mutating]
    if ours is not None and ISTIO_INJECTOR in names and \
            str(ours.get("metadata", {}).get("name", "")) > ISTIO_INJECTOR:
        yield Finding("warning", "WebhookAfterIstio", _name(ours),
                      "mutating webhooks run in name order: Muster's runs after Istio's "
                      "injector, so its sidecar opt-out comes too late for the first pass",
                      "name Muster's configuration so it sorts first (the chart uses 0-<release>)")


def _webhook_safety(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    ours = _ours(s)
    if ours is None:
        yield Finding("error", "WebhookNotInstalled",
                      f"MutatingWebhookConfiguration/{s.webhook_configuration}",
                      "Muster's webhook configuration is missing: no policy applies",
                      "helm upgrade --install the chart (or check --release)")
        return
    for hook in ours.get("webhooks") or ():
        if ((hook.get("clientConfig") or {}).get("service") or {}).get("path") == \
                keys.FAIL_CLOSED_PATH:
            yield _fail_closed(s, ours, hook)
        elif hook.get("failurePolicy", "Fail") != "Ignore":
            yield Finding("warning", "WebhookFailsClosed", _name(ours),
                          f"webhook {hook.get('name')}: failurePolicy "
                          f"{hook.get('failurePolicy', 'Fail')}: when Muster is down, no pod in "
                          "the matched namespaces can be created", "set failurePolicy: Ignore "
                          "(chart value webhook.failurePolicy)")
        excluded = set()
        for expr in (hook.get("namespaceSelector") or {}).get("matchExpressions") or ():
            if expr.get("key") == "kubernetes.io/metadata.name" and expr.get("operator") == \
                    "NotIn":
                excluded |= set(expr.get("values") or ())
        missing = [n for n in (*SAFE_EXCLUDED, s.namespace) if n not in excluded]
        if missing:
            yield Finding("warning", "SystemNamespacesNotExcluded", _name(ours),
                          f"webhook {hook.get('name')} also intercepts {', '.join(missing)}: "
                          "the cluster's own pods then depend on Muster",
                          "restore the chart's namespaceSelector exclusions")


def _fail_closed(s: Snapshot, ours: Obj, hook: Obj) -> Finding:
    """The chart's entry for namespaces that chose to be refused rather than admitted
    unmutated: said, not warned of, with the namespaces that carry its label."""
    wanted = _wanted_labels(hook)
    message = (f"webhook {hook.get('name')}: pods of namespaces labelled {_labels(wanted)} "
               f"are refused while Muster cannot apply their policies (failurePolicy "
               f"{hook.get('failurePolicy', 'Fail')})")
    if s.namespaces is not None:
        named = sorted(n for n, has in _namespace_labels(s).items() if all(
            has.get(str(e.get("key"))) in (e.get("values") or ()) for e in wanted))
        message += (f": {', '.join(named[:5])}" + (f" and {len(named) - 5} more"
                                                    if len(named) > 5 else "")
                    if named else ": no namespace carries it yet")
    return Finding("info", "FailClosedNamespaces", _name(ours), message,
                   "label a namespace so to add it; chart value "
                   "webhook.failClosedNamespaceLabel")


def _wanted_labels(hook: Obj) -> list[Obj]:
    return [e for e in (hook.get("namespaceSelector") or {}).get("matchExpressions") or ()
            if e.get("operator") == "In"]


def _labels(wanted: list[Obj]) -> str:
    return " and ".join(f"{e.get('key')}={','.join(e.get('values') or ())}"
                        for e in wanted) or "(any)"


def _when_unanswered(hook: Obj) -> str:
    """What the API server does with an entry's pods when the webhook cannot answer."""
    policy = hook.get("failurePolicy", "Fail")
    if policy == "Ignore":
        return f"pods are admitted unchanged (failurePolicy {policy})"
    wanted = _wanted_labels(hook)
    where = f" in namespaces labelled {_labels(wanted)}" if wanted else ""
    return f"pods{where} are refused (failurePolicy {policy})"


def _endpoints(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    # an endpoint whose readiness is not known counts as ready, as the API documents
    ready = [e for es in s.endpoint_slices for e in es.get("endpoints") or ()
             if e.get("addresses") and (e.get("conditions") or {}).get("ready") is not False]
    if not ready:
        ours = _ours(s)
        said = [_when_unanswered(h) for h in (ours or {}).get("webhooks") or ()]
        yield Finding("error", "WebhookNotReady", f"Service/{s.namespace}/{s.service}",
                      f"no Ready webhook endpoint: after the webhook's timeout, "
                      f"{'; '.join(said) or 'no policy applies'}",
                      f"kubectl -n {s.namespace} get pods, and the webhook's logs")


def _ca_bundle(s: Snapshot, now: dt.datetime) -> Iterator[Finding]:
    ours = _ours(s)
    if ours is None or s.serving_cert is None:
        return
    serving = x509.load_pem_x509_certificate(s.serving_cert)
    left = serving.not_valid_after_utc - now
    if left < dt.timedelta(days=30):
        yield Finding("warning" if left.total_seconds() > 0 else "error", "CertificateExpiring",
                      f"Secret/{s.namespace}/{s.serving_secret or s.service + '-tls'}",
                      f"the serving certificate expires in {max(0, left.days)} days",
                      "check the certificate manager (self mode: the certs sidecar's logs)")
    for hook in ours.get("webhooks") or ():
        bundle = base64.b64decode((hook.get("clientConfig") or {}).get("caBundle") or "")
        cas = x509.load_pem_x509_certificates(bundle) if bundle else []
        issuers = [ca for ca in cas if _signed_by(serving, ca)]
        if not issuers:
            yield Finding("error", "CaBundleMismatch", _name(ours),
                          f"webhook {hook.get('name')}: the caBundle does not verify the serving "
                          f"certificate: every call fails TLS and {_when_unanswered(hook)}",
                          "run the chart's certificate hook again (helm upgrade)")
        elif all(ca.not_valid_after_utc - now < dt.timedelta(days=30) for ca in issuers):
            days = max(0, min((ca.not_valid_after_utc - now).days for ca in issuers))
            yield Finding("warning", "CaBundleExpiring", _name(ours),
                          f"webhook {hook.get('name')}: the CA in the caBundle expires in "
                          f"{days} days", "rotate the CA (self mode: delete the CA Secret and "
                          "helm upgrade)")


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _gpu_nodes(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    for node in s.nodes:
        meta = node.get("metadata") or {}
        if (meta.get("labels") or {}).get(keys.LABEL_GPU_TOPOLOGY) != \
                keys.LABEL_GPU_TOPOLOGY_ENABLED:
            continue
        if keys.ANN_NODE_TOPOLOGY not in (meta.get("annotations") or {}):
            yield Finding("error", "TopologyNotPublished", _name(node),
                          "labelled for topology placement but no topology is published: the "
                          "binder places no GPU pod here", "check the agent DaemonSet's pod on "
                          "this node (muster agent logs)")
        taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or ()}
        if keys.TAINT_GPU_TOPOLOGY not in taints:
            yield Finding("warning", "TopologyNodeNotTainted", _name(node),
                          "GPU pods of the default scheduler can land here and fragment the "
                          "node, after which whole-node gangs starve (measured: 2,000 one-GPU "
                          "pods spread 4 per node over 500 nodes left no room for an 8-GPU gang)",
                          f"kubectl taint node {meta.get('name')} "
                          f"{keys.TAINT_GPU_TOPOLOGY}=enabled:NoSchedule")


def _gpu_agents(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    """A node whose GPU-agent record (`muster.io/gpu-agent`) keeps the binder's GPU pods off
    it, as the binder decides (`agent_wait`): an error when no agent pod runs on the node any
    more (the record outlived the agent), a warning while one is there but not serving."""
    if s.agent_pods is None:
        return
    pods = {(p["metadata"].get("namespace"), p["metadata"].get("name")): p for p in s.agent_pods}
    running = {(p.get("spec") or {}).get("nodeName") for p in s.agent_pods
               if not (p["metadata"].get("deletionTimestamp"))}
    for node in s.nodes:
        meta = node.get("metadata") or {}
        name = str(meta.get("name"))
        record = parse_agent((meta.get("annotations") or {}).get(keys.ANN_GPU_AGENT))
        pod = pods.get((record.namespace, record.name)) \
            if isinstance(record, AgentPod) else None
        why = agent_wait(record, parse_pod(pod) if pod is not None else None, name)
        if why is None:
            continue
        if name not in running:
            yield Finding("error", "GpuAgentGone", _name(node),
                          f"the binder places no GPU pod here: {why}, and no Muster agent pod "
                          "runs on the node", "if the node still serves GPUs, see why the agent "
                          "DaemonSet has no pod there (its nodeSelector, tolerations); if it no "
                          f"longer does, remove the record: kubectl annotate node {name} "
                          f"{keys.ANN_GPU_AGENT}-")
        else:
            yield Finding("warning", "GpuAgentNotServing", _name(node),
                          f"the binder places no GPU pod here: {why}",
                          f"kubectl -n {s.namespace} get pods -l app.kubernetes.io/component="
                          f"agent --field-selector spec.nodeName={name}, and that pod's logs")


def _gpu_node_objects(s: Snapshot) -> list[Obj]:
    return [n for n in s.nodes if ((n.get("metadata") or {}).get("labels") or {}).get(
        keys.LABEL_GPU_TOPOLOGY) == keys.LABEL_GPU_TOPOLOGY_ENABLED]


def _lacking(nodes: Iterable[Obj], label: str) -> list[str]:
    """The names of the nodes without `label`, sorted."""
    return sorted(str((n.get("metadata") or {}).get("name")) for n in nodes
                  if label not in ((n.get("metadata") or {}).get("labels") or {}))


def _shown(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _network(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    """The network levels' findings: the node labels policies name (a tierName names a
    HyperNode tier, no label), and the HyperNodes', where they are the binder's levels; the
    HyperNodes are read once, as the binder reads them."""
    tiers = None
    if s.levels.hypernodes and s.hypernodes is not None:
        view = HyperNodeView()
        for obj in s.hypernodes:
            view.on_event("ADDED", obj)
        tiers = view.tiers({str((n.get("metadata") or {}).get("name")): parse_node(n)
                            for n in s.nodes})[0]
    levels = tiers.levels if tiers is not None else \
        s.levels.on((n.get("metadata") or {}).get("labels") or {} for n in s.nodes)
    if s.levels.topology is not None:
        levels, found = _topology(s.levels.topology, s.topology)
        yield from found
    yield from _network_labels(s, levels)
    yield from _widest_level(s, levels)
    yield from _hypernodes(s, tiers)


def _topology(ref: TopologyRef, obj: Obj | None) -> tuple[Levels, list[Finding]]:
    """The levels of the Topology object the binder's levels name, read as the binder reads it,
    and what keeps the binder from reading it."""
    view = TopologyView(ref)
    where = f"Topology/{ref.name}"
    if obj is None:
        return view.levels, [Finding(
            "warning", "NetworkTopologyMissing", where, f"the binder's network levels are "
            f"{ref.says} (--network-levels {ref}), which is not in the cluster: a gang that "
            "names a level is placed by that label alone", f"create the Topology "
            f"({ref.group}), or set the chart's binder.networkLevels to one that exists")]
    read = view.on_event("ADDED", obj)
    if read.problem:
        return view.levels, [Finding(
            "warning", "NetworkTopologyUnread", where, f"{read.problem}: a running binder "
            "keeps the levels it last read, one that starts now has none",
            f"fix its spec.levels (kubectl get topologies.{ref.group} {ref.name} -o yaml)")]
    return view.levels, []


def _widest_level(s: Snapshot, levels: Levels) -> Iterator[Finding]:
    """Where the binder's levels are node labels: GPU nodes without the widest, which are in
    no domain of any level (as a node with no label of a level is in no narrower one), and
    Topograph's levels that no node carries."""
    if s.levels.hypernodes:
        return
    if s.levels.topograph and not levels.labels:
        yield Finding("warning", "NetworkLevelMissing", "Nodes", "the binder's network levels "
                      "are the labels NVIDIA Topograph writes (--network-levels topograph), but "
                      "no node carries them: a gang that names a level is placed by that label "
                      "alone", "run Topograph's Kubernetes engine, or set the chart's "
                      "binder.networkLevels to the labels the nodes carry")
    if not levels.labels:
        return
    widest = levels.labels[0]
    lacking = _lacking(_gpu_node_objects(s), widest)
    if lacking:
        yield Finding("warning", "NetworkLevelMissing", "Nodes",
                      f"{len(lacking)} GPU node(s) lack the binder's widest network level "
                      f"{widest} ({_shown(lacking)}): they are in no domain of any level, so a "
                      "gang that names a level uses them only as a preferred gang's last "
                      "resort", f"kubectl label node <node> {widest}=<its domain>, or declare "
                      "the levels these nodes carry (--network-levels)")


def _hypernodes(s: Snapshot, tiers: Tiers | None) -> Iterator[Finding]:
    """Where the binder's levels are Volcano's HyperNodes: their CRD, the GPU nodes no
    HyperNode holds (in no domain: a gang that names a tier never uses them), and what of the
    HyperNodes the binder leaves out (`tiers`: what they make of the nodes)."""
    if not s.levels.hypernodes:
        return
    if tiers is None:
        yield Finding("error", "HyperNodeCRDMissing", f"CustomResourceDefinition/{HYPERNODE_CRD}",
                      "the binder's network levels are Volcano's HyperNodes (--network-levels "
                      "volcano) but their CRD is not installed: a gang that names a tier is "
                      "placed on one node or waits", "install Volcano's HyperNode CRD "
                      "(topology.volcano.sh/v1alpha1) and its HyperNodes, or set the chart's "
                      "binder.networkLevels to node labels")
        return
    outside = sorted(str((n.get("metadata") or {}).get("name")) for n in _gpu_node_objects(s)
                     if (n.get("metadata") or {}).get("name") not in tiers.domains)
    if outside:
        yield Finding("warning", "HyperNodeMissing", "HyperNodes",
                      f"{len(outside)} GPU node(s) are in no HyperNode ({_shown(outside)}): "
                      "gangs that name a network tier never use them", "add them to a leaf "
                      "HyperNode's members (exactMatch, regexMatch or labelMatch)")
    for problem in tiers.problems:
        yield Finding("warning", "HyperNodeUnread", "HyperNodes", f"the binder leaves out: "
                      f"{problem}", "fix the HyperNode (kubectl get hypernodes -o yaml)")


def _network_labels(s: Snapshot, levels: Levels) -> Iterator[Finding]:
    """GPU nodes without a node label that a policy's network level names (an alias read as
    `levels` give it): that policy's gangs never use them (a node outside a level's domains is
    in none of them). A HyperNode tier's level is no label (`_hypernodes` checks those)."""
    gpu_nodes = _gpu_node_objects(s)
    for policy in s.policies.policies if s.policies else ():
        network = policy.spec.topology.network if policy.spec.topology else None
        if network is None:
            continue
        wanted = [network.required, network.preferred,
                  network.slice.level if network.slice else None]
        for label in dict.fromkeys(levels.label(w) for w in wanted if w):
            if label == keys.HOSTNAME_LABEL or label.startswith(TIER_LABEL_PREFIX):
                continue
            lacking = _lacking(gpu_nodes, label)
            if lacking:
                yield Finding("warning", "NetworkLabelMissing", f"SchedulingPolicy/{policy.name}",
                              f"{len(lacking)} GPU node(s) lack the label {label} that the "
                              f"policy's network level names ({_shown(lacking)}): its gangs "
                              "never use them", f"kubectl label node <node> {label}=<its "
                              "domain>, or --network-levels / Topograph to label them")


def _podgroups(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    for kind, pg in s.podgroups:
        if not made_by_muster(pg):
            continue
        meta = pg.get("metadata") or {}
        ref = controller_ref(pg)
        job = s.jobs.get(str(ref.get("uid"))) if ref is not None else None
        if job is None:
            yield Finding("warning", "PodGroupOrphaned", _name(pg),
                          "its job is gone: the PodGroup holds its minResources against the queue",
                          f"kubectl -n {meta.get('namespace')} delete podgroup {meta.get('name')}")
            continue
        reason = cleanup_reason(kind, job, str(meta.get("name")))
        if reason:
            yield Finding("warning", "PodGroupOfFinishedJob", _name(pg),
                          f"{reason}, but its PodGroup is still there (the webhook's janitor "
                          "deletes it within --podgroup-cleanup-interval)",
                          "check the webhook's logs and its Lease <release>-webhook-podgroup-"
                          "cleanup")


def _binder(s: Snapshot, now: dt.datetime) -> Iterator[Finding]:
    if not s.binder_deployed:
        return
    lease = s.leases.get(s.binder_lease)
    spec = (lease or {}).get("spec") or {}
    holder, renewed = spec.get("holderIdentity"), spec.get("renewTime")
    stale = True
    if holder and renewed:
        when = dt.datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
        stale = (now - when).total_seconds() > float(spec.get("leaseDurationSeconds") or 15)
    if stale:
        yield Finding("error", "BinderNotLeading", f"Lease/{s.namespace}/{s.binder_lease}",
                      "no binder replica holds the Lease: topology gangs are not placed",
                      f"kubectl -n {s.namespace} get pods -l app.kubernetes.io/component=binder")


def _namespace_labels(s: Snapshot) -> dict[str, Mapping[str, str]]:
    return {str(n["metadata"]["name"]): (n["metadata"].get("labels") or {})
            for n in s.namespaces or ()}


def _matched(policy: SchedulingPolicy, labels: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The namespaces (of `labels`: name -> its labels) a policy's namespaces and
    namespaceSelector match (pod selectors need pods: not judged)."""
    compiled = compile_policy(policy, ())
    names = [n for n in labels if compiled.namespaces is None or n in compiled.namespaces]
    if compiled.ns_selector is not None:
        names = [n for n in names if selector_matches(compiled.ns_selector, labels[n])]
    return names


def _matching(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    """Policies no namespace of the cluster can match."""
    if s.policies is None or s.namespaces is None:
        return
    labels = _namespace_labels(s)
    for policy in s.policies.policies:
        if not _matched(policy, labels):
            yield Finding("warning", "PolicyMatchesNothing", f"SchedulingPolicy/{policy.name}",
                          "no namespace of the cluster matches its namespaces/namespaceSelector",
                          "fix the namespace names or labels it selects, or delete it")


def _shadowed(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    """A policy whose every field an earlier one with the same match writes never applies
    (the first writer wins)."""
    ordered = list(s.policies.policies) if s.policies else []
    for i, later in enumerate(ordered):
        writes = set(written_fields(later))
        for earlier in ordered[:i]:
            if earlier.spec.enforcement == "enforce" and earlier.spec.match == later.spec.match \
                    and writes and writes <= set(written_fields(earlier)):
                yield Finding("warning", "PolicyShadowed", f"SchedulingPolicy/{later.name}",
                              f"policy {earlier.name} matches the same pods first and writes "
                              "every field this one writes: it never changes a pod",
                              "give it a higher spec.priority, narrow its match, or delete it")
                break


def _waiting(s: Snapshot, now: dt.datetime) -> Iterator[Finding]:
    """Binder gangs pending longer than their own timeout, with the binder's reason."""
    for pod in s.waiting_pods:
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        try:
            timeout = int(ann.get(keys.ANN_GANG_TIMEOUT) or 0)
            created = dt.datetime.fromisoformat(str(meta.get("creationTimestamp")).replace(
                "Z", "+00:00"))
        except ValueError:
            continue
        if not timeout or (now - created).total_seconds() <= timeout:
            continue
        said = scheduled_message(pod)
        yield Finding("warning", "GangWaiting", _name(pod),
                      f"gang {ann.get(keys.ANN_GANG_NAME)} has waited "
                      f"{int((now - created).total_seconds())} s, past its {timeout} s timeout: "
                      f"{said or 'the binder has not said why (is it running?)'}",
                      advice(wait_kind(said), s.namespace))


def _preemptions(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    """When and why the binder preempted: one finding per gang and side, from its Events (the
    victims' pods are gone by now; their Events stay for the Events' lifetime)."""
    seen: set[tuple[str, str, str]] = set()
    for event in sorted(s.preemption_events, key=lambda e: str(e.get("lastTimestamp") or "")):
        reason, message = event.get("reason"), str(event.get("message") or "")
        ref = event.get("involvedObject") or {}
        ns = str(ref.get("namespace") or "")
        if reason not in (PREEMPTED, PREEMPTING) or (ns, str(reason), message) in seen:
            continue
        seen.add((ns, str(reason), message))
        when = str(event.get("lastTimestamp") or event.get("firstTimestamp") or "?")
        pod = f"Pod/{ns}/{ref.get('name', '?')}"
        if reason == PREEMPTED:
            yield Finding("info", "GangPreempted", pod, f"at {when}: {message}",
                          "to keep such a gang running, give it a higher PriorityClass, or a "
                          "PodDisruptionBudget (docs/binder.md, \"Priority and preemption\")")
        else:
            yield Finding("info", "GangPreempting", pod, f"at {when}: {message}",
                          "nothing to do: it is placed once they are gone; policies set who may "
                          "preempt (gang.preemption), PriorityClasses whom")


def _tas_queues(kueue: Mapping[str, Sequence[Obj]]) -> dict[tuple[str, str], str]:
    """Kueue's LocalQueues (namespace, name) whose ClusterQueue has a flavor of a Kueue
    Topology (Kueue's topology-aware scheduling places their workloads' pods), with how."""
    topology = {str(f["metadata"]["name"]): str(f["spec"]["topologyName"])
                for f in kueue.get("resourceflavors", ())
                if (f.get("spec") or {}).get("topologyName")}
    by_queue: dict[str, str] = {}
    for cq in kueue.get("clusterqueues", ()):
        for group in (cq.get("spec") or {}).get("resourceGroups") or ():
            for flavor in group.get("flavors") or ():
                name = str(flavor.get("name"))
                if name in topology:
                    by_queue.setdefault(str(cq["metadata"]["name"]),
                                        f"ClusterQueue {cq['metadata']['name']}, flavor {name} "
                                        f"of Topology {topology[name]}")
    return {(str(lq["metadata"].get("namespace")), str(lq["metadata"]["name"])):
            by_queue[str((lq.get("spec") or {}).get("clusterQueue"))]
            for lq in kueue.get("localqueues", ())
            if str((lq.get("spec") or {}).get("clusterQueue")) in by_queue}


def _beside_kueue_tas(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    """A policy that must keep a gang on one node, in namespaces whose Kueue queues place pods
    by Kueue's topology-aware scheduling: Kueue may spread a gang over nodes (each pod's node
    in its nodeSelector), and no placement then meets both, so the gang waits."""
    if s.policies is None or not s.kueue:
        return
    queues = _tas_queues(s.kueue)
    labels = _namespace_labels(s)
    for policy in s.policies.policies:
        topology = policy.spec.topology
        if topology is None or not topology.singleNode or topology.mode != "required":
            continue
        matched = set(_matched(policy, labels))
        hit = sorted((ns, lq) for ns, lq in queues if ns in matched)
        if not hit:
            continue
        ns, lq = hit[0]
        more = f" (and {len(hit) - 1} more LocalQueues)" if len(hit) > 1 else ""
        yield Finding("warning", "SingleNodeBesideKueueTAS", f"SchedulingPolicy/{policy.name}",
                      f"it keeps a gang on one node (topology.singleNode, mode required) in "
                      f"namespace {ns}, whose LocalQueue {lq} ({queues[ns, lq]}) is placed by "
                      f"Kueue's topology-aware scheduling{more}: a gang Kueue spreads over "
                      "nodes waits unbound, and waitForPodsReady evicts it",
                      "give jobs in these queues a policy without singleNode (network "
                      "jobAnnotations: honour takes Kueue's levels), or ask Kueue for one node "
                      "(kueue.x-k8s.io/podset-required-topology: kubernetes.io/hostname)")


def coscheduling_schedulers(policies: PolicySet | None) -> set[str]:
    """The schedulerName each coscheduling policy's pods get (the default scheduler's when the
    policy names none: the plugin then runs inside it)."""
    return {gang.schedulerName or "default-scheduler" for _, gang in
            _gangs(Snapshot("", "", "", "", policies=policies)) if gang.backend == "coscheduling"}


def _schedulers(s: Snapshot, now: dt.datetime) -> Iterator[Finding]:
    """A running scheduler binds a pod or sets PodScheduled=False with its reason within
    seconds; pods of its name unbound for long with neither have no scheduler at all."""
    names = coscheduling_schedulers(s.policies)
    stuck: dict[str, list[str]] = {}
    for pod in s.unscheduled_pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        name = spec.get("schedulerName") or "default-scheduler"
        if name not in names or any(c.get("type") == "PodScheduled" for c in (
                pod.get("status") or {}).get("conditions") or ()):
            continue
        try:
            created = dt.datetime.fromisoformat(str(meta.get("creationTimestamp")).replace(
                "Z", "+00:00"))
        except ValueError:
            continue
        if (now - created).total_seconds() > s.stuck_after:
            stuck.setdefault(name, []).append(f"{meta.get('namespace')}/{meta.get('name')}")
    for name, pods in sorted(stuck.items()):
        yield Finding("error", "SchedulerNotRunning", f"Scheduler/{name}",
                      f"coscheduling pods wait for scheduler {name!r}, which has not looked at "
                      f"{len(pods)} of them in {s.stuck_after:g} s (e.g. {pods[0]}): it is not "
                      "running", f"install scheduler-plugins as {name!r}, or fix the policy's "
                      "gang.schedulerName")


def not_enforced(policies: PolicySet | None) -> list[str]:
    """The policies in audit or warn mode (their Events are read only when there are some)."""
    return [p.name for p in policies or () if p.spec.enforcement != "enforce"]


def _not_enforced(s: Snapshot, _now: dt.datetime) -> Iterator[Finding]:
    """What each policy in audit or warn mode would do, from the Events the webhook records once
    per workload and policy: the evidence for switching it to enforce."""
    told: dict[str, list[tuple[bool, Obj]]] = {}
    for event in s.audit_events:
        read = read_event(str(event.get("message") or ""))
        if event.get("reason") == EVENT_REASON and read is not None:
            told.setdefault(read[0], []).append((read[1], event))
    for policy in s.policies.policies if s.policies else ():
        mode = policy.spec.enforcement
        if mode == "enforce":
            continue
        seen = told.get(policy.name, [])
        changed = [e for would, e in seen if would]
        what = "changes no pod" + (" and warns whoever creates one it matches"
                                   if mode == "warn" else "")
        if changed:
            latest = max(changed, key=lambda e: str(e.get("lastTimestamp") or ""))
            ref = latest.get("involvedObject") or {}
            said = f"{len(changed)} workload(s) it would change" + (
                f" and {len(seen) - len(changed)} it matches without changing" if
                len(seen) > len(changed) else "") + (
                f", e.g. {ref.get('kind')} {ref.get('namespace')}/{ref.get('name')}: "
                f"{latest.get('message')}")
        elif seen:
            said = (f"{len(seen)} workload(s) it matches, none of which it would change (the "
                    "enforced policies already do it, or override it)")
        else:
            said = ("no workload it matched yet (Events last the API server's --event-ttl, "
                    "1 h by default)")
        yield Finding("info", "PolicyNotEnforced", f"SchedulingPolicy/{policy.name}",
                      f"in {mode} mode: it {what}. Its {EVENT_REASON} Events name {said}",
                      "when that is what it should do, set spec.enforcement: enforce (or remove "
                      "it) in the chart's values and helm upgrade (docs/policies.md, \"Rolling "
                      "out a policy\")")
