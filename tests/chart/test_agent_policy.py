"""The chart's ValidatingAdmissionPolicies that confine the node agent to its own Node and to the
pods bound to it, evaluated as kube-apiserver evaluates them: matchConditions, then the variables,
then every validation (an error refuses: failurePolicy Fail), on AdmissionRequests shaped as the
API server builds them (tests/chart/cel_policy.py);
tests/real/test_agent_scope.py makes the same writes against a real API server."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from cel_policy import Policy, Verdict
from chart_helpers import CHART, NAMESPACE, Obj, find, one, run_helm

from webhook import keys

Render = Callable[..., list[Obj]]

AGENT = f"system:serviceaccount:{NAMESPACE}:muster-agent"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
POD_NAME_CLAIM = "authentication.kubernetes.io/pod-name"
POD_UID_CLAIM = "authentication.kubernetes.io/pod-uid"
#: the record the agent of the token `_request` makes writes on its Node: its own pod
OWN_RECORD = keys.gpu_agent(NAMESPACE, "muster-agent-x", "u1")
OWN, OTHER = "gpu-a", "gpu-b"


def _request(op: str, resource: str, name: str, *, namespace: str = "",
             user: str = AGENT, node: str | None = OWN, sub: str = "") -> Obj:
    """An AdmissionRequest as kube-apiserver converts it for CEL: absent fields omitted."""
    user_info: Obj = {"username": user, "uid": "u-1",
                      "groups": ["system:serviceaccounts", "system:authenticated"]}
    if node is not None:
        user_info["extra"] = {NODE_CLAIM: [node], POD_NAME_CLAIM: ["muster-agent-x"],
                              POD_UID_CLAIM: ["u1"]}
    request: Obj = {"uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": resource},
                    "name": name, "operation": op, "userInfo": user_info, "dryRun": False}
    if namespace:
        request["namespace"] = namespace
    if sub:
        request["subResource"] = sub
    return request


def _node(name: str, labels: Obj | None = None) -> Obj:
    node: Obj = {"apiVersion": "v1", "kind": "Node",
                 "metadata": {"name": name, "uid": f"uid-{name}",
                              "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
                 "spec": {"taints": [{"key": keys.TAINT_GPU_TOPOLOGY, "effect": "NoSchedule"}]}}
    return node


def _pod(name: str, node: str | None) -> Obj:
    pod: Obj = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                             "labels": {"app": "train"}},
                "spec": {"containers": [{"name": "c", "image": "trainer:1"}]}}
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


def _with(obj: Obj, path: str, key: str, value: str | None) -> Obj:
    out = copy.deepcopy(obj)
    meta = out["metadata"].setdefault(path, {})
    if value is None:
        meta.pop(key, None)
    else:
        meta[key] = value
    return out


@pytest.fixture(scope="module")
def policies() -> dict[str, Policy]:
    """The policies of the chart with default values."""
    proc = run_helm("template", "muster", str(CHART), "--namespace", NAMESPACE)
    assert proc.returncode == 0, proc.stderr
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    vaps = find(objs, "ValidatingAdmissionPolicy")
    return {v["metadata"]["name"]: Policy(v) for v in vaps}


def _nodes(policies: dict[str, Policy]) -> Policy:
    return policies["muster-agent-own-node"]


def _pods(policies: dict[str, Policy]) -> Policy:
    return policies["muster-agent-own-node-pods"]


def _node_write(policies: dict[str, Policy], name: str, new: Obj, old: Obj, **kw: Any
                ) -> Verdict:
    return _nodes(policies).admit(_request("UPDATE", "nodes", name, **kw), new, old)


def _pod_write(policies: dict[str, Policy], new: Obj, old: Obj, **kw: Any) -> Verdict:
    name = old["metadata"]["name"]
    return _pods(policies).admit(_request("UPDATE", "pods", name, namespace="ml", **kw),
                                 new, old)


# --- what the agent does: allowed -----------------------------------------------------------


def test_the_agent_publishes_on_its_own_node(policies: dict[str, Policy]) -> None:
    old = _node(OWN, {keys.LABEL_GPU_TOPOLOGY: "enabled"})
    new = _with(_with(old, "labels", keys.LABEL_GPU_ALLOCATION_ACK, "true"),
                "annotations", keys.ANN_NODE_TOPOLOGY, '{"v":1}')
    assert _node_write(policies, OWN, new, old) == Verdict(True)
    recorded = _with(new, "annotations", keys.ANN_GPU_AGENT, OWN_RECORD)
    assert _node_write(policies, OWN, recorded, new) == Verdict(True)
    # and removes its labels again (a label going)
    assert _node_write(policies, OWN, old, new) == Verdict(True)


def test_the_agent_marks_a_pod_bound_to_its_node(policies: dict[str, Policy]) -> None:
    old = _pod("w-0", OWN)
    new = _with(old, "annotations", keys.ANN_GPU_ALLOCATED, OWN)
    assert _pod_write(policies, new, old) == Verdict(True)


def test_everyone_else_is_not_matched(policies: dict[str, Policy]) -> None:
    old = _node(OTHER)
    new = _with(old, "labels", "team", "x")
    for user in ("system:serviceaccount:muster-system:muster-binder", "admin",
                 "system:serviceaccount:other-ns:muster-agent"):
        verdict = _node_write(policies, OTHER, new, old, user=user, node=None)
        assert verdict == Verdict(True, "not matched"), user


# --- what a stolen agent token must not do: refused ------------------------------------------


def test_another_node_is_refused(policies: dict[str, Policy]) -> None:
    old = _node(OTHER)
    new = _with(old, "labels", keys.LABEL_GPU_ALLOCATION_ACK, "true")
    verdict = _node_write(policies, OTHER, new, old)
    assert not verdict.allowed
    assert verdict.message == (f"the muster agent of node {OWN} may write only its own Node, "
                               f"not {OTHER}")


@pytest.mark.parametrize("bound", [OTHER, None])
def test_a_pod_on_another_node_or_unbound_is_refused(policies: dict[str, Policy],
                                                     bound: str | None) -> None:
    old = _pod("w-1", bound)
    new = _with(old, "annotations", keys.ANN_GPU_ALLOCATED, OWN)
    verdict = _pod_write(policies, new, old)
    assert not verdict.allowed
    assert verdict.message == (f"the muster agent of node {OWN} may write only pods bound to "
                               f"it; ml/w-1 is bound to {bound or 'no node'}")


@pytest.mark.parametrize("record", [
    keys.gpu_agent(NAMESPACE, "muster-agent-y", "u2"),  # another node's agent
    keys.gpu_agent(NAMESPACE, "muster-agent-x", "u0"),  # the same name, an earlier pod
    keys.gpu_agent("team-a", "muster-agent-x", "u1"),   # a pod of that name elsewhere
])
def test_the_agent_records_no_pod_but_its_own(policies: dict[str, Policy], record: str) -> None:
    """The binder binds GPU pods to a node only while the agent pod recorded there is Ready:
    a stolen agent token must not name a Ready pod that does not serve the node."""
    old = _node(OWN)
    verdict = _node_write(policies, OWN, _with(old, "annotations", keys.ANN_GPU_AGENT, record),
                          old)
    assert verdict == Verdict(False, "the muster agent may record only its own pod in "
                              f"{keys.ANN_GPU_AGENT} ({OWN_RECORD}), not {record}")


def test_the_record_may_stay_go_or_be_replaced_by_its_own(policies: dict[str, Policy]) -> None:
    """Another pod's record (the agent before this one) stays through the agent's other
    writes, is replaced by its own, or is removed (an agent without a device plugin)."""
    before = _with(_node(OWN), "annotations", keys.ANN_GPU_AGENT,
                   keys.gpu_agent(NAMESPACE, "muster-agent-old", "u0"))
    acked = _with(before, "labels", keys.LABEL_GPU_ALLOCATION_ACK, "true")
    assert _node_write(policies, OWN, acked, before) == Verdict(True)
    own = _with(before, "annotations", keys.ANN_GPU_AGENT, OWN_RECORD)
    assert _node_write(policies, OWN, own, before) == Verdict(True)
    assert _node_write(policies, OWN, _with(before, "annotations", keys.ANN_GPU_AGENT, None),
                       before) == Verdict(True)


def test_a_token_bound_to_no_pod_records_nothing(policies: dict[str, Policy]) -> None:
    old = _node(OWN)
    request = _request("UPDATE", "nodes", OWN)
    for claim in (POD_NAME_CLAIM, POD_UID_CLAIM):
        del request["userInfo"]["extra"][claim]
    verdict = _nodes(policies).admit(
        request, _with(old, "annotations", keys.ANN_GPU_AGENT, OWN_RECORD), old)
    assert verdict == Verdict(False, "the muster agent may record only its own pod in "
                              f"{keys.ANN_GPU_AGENT} (its token is bound to no pod), not "
                              f"{OWN_RECORD}")


def test_a_token_without_a_node_is_refused(policies: dict[str, Policy]) -> None:
    old = _node(OWN)
    new = _with(old, "labels", keys.LABEL_GPU_ALLOCATION_ACK, "true")
    verdict = _node_write(policies, OWN, new, old, node=None)
    assert not verdict.allowed and "bound to no node" in verdict.message
    pod = _pod("w-2", OWN)
    assert not _pod_write(policies, _with(pod, "annotations", "muster.io/x", "1"), pod,
                          node=None).allowed


@pytest.mark.parametrize(("where", "key"), [
    ("labels", "node-role.kubernetes.io/control-plane"),  # a new label
    ("labels", "kubernetes.io/hostname"),                 # a label changed or removed
    ("annotations", "volumes.kubernetes.io/controller-managed-attach-detach"),
])
def test_only_muster_keys_on_its_own_node(policies: dict[str, Policy], where: str,
                                          key: str) -> None:
    old = _with(_node(OWN), "annotations", "volumes.kubernetes.io/controller-managed-attach-"
                "detach", "true")
    for value in ("x", None):
        new = _with(old, where, key, value)
        if new == old:
            continue
        verdict = _node_write(policies, OWN, new, old)
        assert verdict == Verdict(False, "the muster agent may change only muster.io/ labels "
                                         "and annotations"), (key, value)


def test_not_a_pods_spec_or_its_labels(policies: dict[str, Policy]) -> None:
    old = _pod("w-3", OWN)
    image = copy.deepcopy(old)
    image["spec"]["containers"][0]["image"] = "evil:1"
    assert _pod_write(policies, image, old) == Verdict(
        False, "the muster agent may not change a pod's spec, finalizers or owners")
    finalizer = copy.deepcopy(old)
    finalizer["metadata"]["finalizers"] = ["example.com/hold"]
    assert not _pod_write(policies, finalizer, old).allowed
    relabel = _with(old, "labels", "app", "serve")  # would move it into another Service
    assert not _pod_write(policies, relabel, old).allowed


def test_not_its_own_nodes_taints(policies: dict[str, Policy]) -> None:
    old = _node(OWN)
    new = copy.deepcopy(old)
    new["spec"]["taints"] = []
    assert not _node_write(policies, OWN, new, old).allowed


@pytest.mark.parametrize(("op", "resource", "sub"), [
    ("CREATE", "nodes", ""), ("DELETE", "nodes", ""), ("UPDATE", "nodes", "status"),
    ("CREATE", "pods", ""), ("DELETE", "pods", ""), ("UPDATE", "pods", "status"),
    ("CREATE", "pods", "eviction"), ("UPDATE", "pods", "ephemeralcontainers"),
])
def test_only_updates_of_the_objects_themselves(policies: dict[str, Policy], op: str,
                                                resource: str, sub: str) -> None:
    if resource == "nodes":
        obj, policy, ns, name = _node(OWN), _nodes(policies), "", OWN
    else:
        obj, policy, ns, name = _pod("w-4", OWN), _pods(policies), "ml", "w-4"
    new = None if op == "DELETE" else obj
    old = None if op == "CREATE" else obj
    verdict = policy.admit(_request(op, resource, name, namespace=ns, sub=sub), new, old)
    assert not verdict.allowed, (op, resource, sub)
    assert verdict.message.startswith(f"the muster agent only patches {resource}"), verdict


# --- the chart --------------------------------------------------------------------------------


def _agent_policies(objs: list[Obj], kind: str = "ValidatingAdmissionPolicy") -> list[Obj]:
    """This chart's agent policies (the annotation guard is another template's)."""
    return [o for o in find(objs, kind) if "-agent-own-node" in o["metadata"]["name"]]


def test_policies_are_bound_and_can_be_turned_off(helm_template: Render) -> None:
    objs = helm_template()
    names = {"muster-agent-own-node", "muster-agent-own-node-pods"}
    assert {v["metadata"]["name"] for v in _agent_policies(objs)} == names
    for name in names:
        binding = one(objs, "ValidatingAdmissionPolicyBinding", name)
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        policy = one(objs, "ValidatingAdmissionPolicy", name)
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    for values in ({"agent": {"nodeRestriction": {"enabled": False}}},
                   {"agent": {"enabled": False}}):
        objs = helm_template(values)
        assert not _agent_policies(objs)
        assert not _agent_policies(objs, "ValidatingAdmissionPolicyBinding")


def test_the_policy_names_the_release_agent(helm_template: Render) -> None:
    objs = helm_template(release="gpu", namespace="gpu-system")
    sa = one(objs, "ServiceAccount", "gpu-muster-agent")
    for vap in _agent_policies(objs):
        (cond,) = vap["spec"]["matchConditions"]
        assert cond["expression"] == (
            "request.userInfo.username == 'system:serviceaccount:gpu-system:"
            f"{sa['metadata']['name']}'")


# --- the DRA driver's ResourceSlices ----------------------------------------------------------

def _slice(node: str, driver: str = keys.DRA_DRIVER) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node, "devices": [],
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


@pytest.fixture(scope="module")
def slice_policy() -> Policy:
    proc = run_helm("template", "muster", str(CHART), "--namespace", NAMESPACE,
                    "--set", "agent.gpuServing=dra")
    assert proc.returncode == 0, proc.stderr
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return Policy(one(objs, "ValidatingAdmissionPolicy", "muster-agent-own-resourceslices"))


def _slice_write(policy: Policy, op: str, new: Obj | None, old: Obj | None, **kw: Any
                 ) -> Verdict:
    name = (new or old or {})["metadata"]["name"]
    request = _request(op, "resourceslices", name, **kw)
    request["resource"]["group"] = "resource.k8s.io"
    return policy.admit(request, new, old)


def test_no_slice_policy_without_dra(policies: dict[str, Policy]) -> None:
    assert "muster-agent-own-resourceslices" not in policies


def test_the_agent_writes_its_own_nodes_slice(slice_policy: Policy) -> None:
    mine = _slice(OWN)
    assert _slice_write(slice_policy, "CREATE", mine, None).allowed
    assert _slice_write(slice_policy, "UPDATE", mine, mine).allowed
    assert _slice_write(slice_policy, "DELETE", None, mine).allowed


def test_no_slice_of_another_node_or_driver(slice_policy: Policy) -> None:
    for op, new, old in (("CREATE", _slice(OTHER), None),
                         ("DELETE", None, _slice(OTHER)),
                         ("UPDATE", _slice(OTHER), _slice(OWN)),  # moving it away
                         ("CREATE", _slice(OWN, "gpu.nvidia.com"), None),
                         ("DELETE", None, _slice(OWN, "gpu.nvidia.com"))):
        verdict = _slice_write(slice_policy, op, new, old)
        assert not verdict.allowed, (op, new, old)
        assert "ResourceSlices of its own node" in verdict.message
    assert not _slice_write(slice_policy, "CREATE", _slice(OWN), None, node=None).allowed
    # nobody but the agent is matched
    assert _slice_write(slice_policy, "CREATE", _slice(OTHER), None,
                        user="system:serviceaccount:x:y").allowed
