"""cdk-nag (v3, AwsSolutions pack) for the app, and the one way constructs acknowledge a finding.

cdk-nag v3 runs as a CDK policy-validation plugin: any unacknowledged finding fails synthesis.
Acknowledgements are `Validations.of(construct).acknowledge(Acknowledgment(id, reason))`, one per
finding (`AwsSolutions::Rule[Finding]` for rules with several findings per resource), made by the
construct that owns the resource, with a reason specific to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, Stack, Validations

if TYPE_CHECKING:
    from constructs import IConstruct

PACK = "AwsSolutions"
# Reasons shared by several constructs.
HANDLER_REASON = (
    "CDK-managed custom-resource handler (kubectl/helm provider): its runtime and execution policy "
    "are chosen by aws-cdk-lib, not by this kit"
)
VPC_CIDR_REASON = "ingress is limited to the VPC CIDR; the rule cannot evaluate the CIDR token"


def add_checks(app: IConstruct) -> None:
    """Run the AwsSolutions pack on every stack of `app` during synthesis."""
    from cdk_nag import AwsSolutionsChecks  # noqa: PLC0415 - only where an app is synthesized

    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, rule: str, reason: str, *, finding: str | None = None) -> None:
    """Acknowledge `rule` (e.g. "IAM4") on `scope` and its children, optionally one finding of it."""
    rule_id = f"{PACK}::{PACK}-{rule}" + (f"[{finding}]" if finding else "")
    Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def managed_policy_finding(name: str) -> str:
    """The IAM4 finding id cdk-nag reports for an AWS managed policy attached by name."""
    return f"Policy::arn:<AWS::Partition>:iam::aws:policy/{name}"


def arn_finding(resource: IConstruct, suffix: str) -> str:
    """The IAM5 finding id for `<LogicalId.Arn>` + suffix (e.g. a bucket's object prefix)."""
    stack = Stack.of(resource)
    child = resource.node.default_child
    if child is None:
        raise ValueError(f"{resource.node.path} has no CloudFormation resource")
    logical_id = stack.resolve(stack.get_logical_id(child))  # type: ignore[arg-type]
    return f"Resource::<{logical_id}.Arn>{suffix}"
