"""The node check's ValidatingAdmissionPolicy, evaluated: its CEL runs in Google's CEL runtime
(cel-expr-python, with the optional-types extension Kubernetes enables) against the admission requests
the API server would build, with the Node objects the check's own patches produce."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import cdk8s
import pytest
from cel_expr_python import cel
from cel_expr_python.ext import ext_optional
from kube_objects import merge_patch

from nvrx_eks.k8s.node_verification import NODE_CHECK, NODE_NAME_EXTRA, NodeCheckSpec, NodeVerification
from nvrx_eks.training.node import nodecheck
from nvrx_eks.training.node.selfcheck import Check, Status

NAMESPACE = "training"
USER = f"system:serviceaccount:{NAMESPACE}:{NODE_CHECK}"
NODE = "ip-10-0-1-23.ec2.internal"


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    chart = cdk8s.Chart(cdk8s.App(), "c")
    NodeVerification(chart, "n", namespace=NAMESPACE, spec=NodeCheckSpec(image="img:1"))
    (found,) = [d for d in chart.to_json() if d["kind"] == "ValidatingAdmissionPolicy"]
    return found["spec"]


@pytest.fixture(scope="module")
def env() -> Any:
    names = ("object", "oldObject", "request")
    return cel.NewEnv(variables=dict.fromkeys(names, cel.Type.DYN), extensions=[ext_optional.ExtOptional()])


def _admit(
    env, policy, *, old: dict, new: dict, user: str = USER, node: str | None = NODE, sub: str = ""
) -> list[str]:
    """Messages of the validations that deny the request ([]: admitted); None when it does not match."""
    extra = {NODE_NAME_EXTRA: [node]} if node else {}
    request = {"userInfo": {"username": user, "extra": extra}, "subResource": sub}
    data = {"object": new, "oldObject": old, "request": request}
    for condition in policy["matchConditions"]:
        if not env.compile(condition["expression"]).eval(data=data).value():
            return ["(not matched)"]
    return [
        v.get("message") or v["messageExpression"]
        for v in policy["validations"]
        if not env.compile(v["expression"]).eval(data=data).value()
    ]


def _node(name: str = NODE) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "7",
            "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge", "nvrx-eks/gpu": "true"},
            "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.1.23"},
        },
        "spec": {
            "providerID": "aws:///us-east-1a/i-0abc",
            "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
        },
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "AcceleratedHardwareReady", "status": "True"},
            ]
        },
    }


def _verdict(*, passed: bool) -> nodecheck.Verdict:
    checks = (Check("GPUs", Status.OK if passed else Status.NODE, "8 of 8" if passed else "7 of 8"),)
    return nodecheck.verdict(checks)


NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _patched(old: dict, *, passed: bool) -> dict:
    patch = nodecheck.node_patch(old, _verdict(passed=passed), NOW)
    patch["metadata"].pop("resourceVersion")
    return merge_patch(old, patch)


@pytest.mark.parametrize("passed", [True, False])
def test_the_checks_own_verdict_on_its_own_node_is_admitted(env, policy, passed):
    old = _node()
    new = _patched(old, passed=passed)
    assert _admit(env, policy, old=old, new=new) == []
    # And lifting the taint again.
    assert _admit(env, policy, old=new, new=_patched(new, passed=not passed)) == []


def test_its_condition_on_node_status_is_admitted_and_no_other(env, policy):
    old = _node()
    status = nodecheck.status_patch(old, _verdict(passed=False), NOW)
    conditions = old["status"]["conditions"] + status["status"]["conditions"]
    new = old | {"status": {"conditions": conditions}}
    assert _admit(env, policy, old=old, new=new, sub="status") == []
    forged = copy.deepcopy(new)
    forged["status"]["conditions"][0]["status"] = "False"  # Ready=False: not the check's to say
    assert _admit(env, policy, old=old, new=forged, sub="status") == [
        f"the node check may set only the {nodecheck.CONDITION_TYPE} condition"
    ]


def test_another_node_is_refused(env, policy):
    other = _node("ip-10-0-9-9.ec2.internal")
    denied = _admit(env, policy, old=other, new=_patched(other, passed=False))
    assert len(denied) == 1
    assert "only the node its pod runs on" in denied[0]


def test_a_token_not_bound_to_a_node_is_refused(env, policy):
    old = _node()
    assert len(_admit(env, policy, old=old, new=_patched(old, passed=True), node=None)) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda n: n["metadata"]["labels"].update({"node-role": "x"}), "may change only the labels"),
        (lambda n: n["metadata"]["labels"].pop("nvrx-eks/gpu"), "may change only the labels"),
        (lambda n: n["metadata"]["annotations"].clear(), "may change only the annotation"),
        (lambda n: n["spec"].update({"taints": []}), "only the nvrx-eks/unverified taint"),
        (lambda n: n["spec"].update({"unschedulable": True}), "may not cordon"),
    ],
)
def test_fields_the_check_does_not_own_are_refused(env, policy, change, message):
    old = _node()
    new = _patched(old, passed=True)
    change(new)
    denied = _admit(env, policy, old=old, new=new)
    assert len(denied) == 1
    assert message in denied[0]


def test_other_users_are_not_matched(env, policy):
    old = _node()
    new = copy.deepcopy(old)
    new["spec"]["taints"] = []
    assert _admit(env, policy, old=old, new=new, user="system:node:" + NODE) == ["(not matched)"]
