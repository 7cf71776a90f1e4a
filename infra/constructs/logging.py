"""The stack's log encryption key and the log groups the services would otherwise create unencrypted.

EKS writes control-plane logs to /aws/eks/<cluster>/cluster and creates that group itself, without
retention or a key, unless it exists first: declaring it here (before the cluster) gives it both, and
deleting the stack removes it. https://docs.aws.amazon.com/eks/latest/userguide/control-plane-logs.html
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from nvrx_eks.infra.constructs.retention import kept_key

CONTROL_PLANE_LOG_RETENTION = logs.RetentionDays.THREE_MONTHS


def control_plane_log_group_name(cluster_name: str) -> str:
    return f"/aws/eks/{cluster_name}/cluster"


class LogEncryption(Construct):
    """A KMS key CloudWatch Logs may use for this account's log groups in this region, and the
    EKS control-plane log group encrypted with it."""

    def __init__(self, scope: Construct, id: str, *, cluster_name: str) -> None:  # noqa: A002
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.key = kept_key(
            self, "Key", description=f"{cluster_name}: CloudWatch Logs (VPC flow logs, EKS control plane)"
        )
        # CloudWatch Logs encrypts with the key as its service principal; the encryption context
        # names the log group, so the grant covers this account's groups in this region only.
        # https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchLogsInThisAccount",
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
                actions=[
                    "kms:Encrypt*",
                    "kms:Decrypt*",
                    "kms:ReEncrypt*",
                    "kms:GenerateDataKey*",
                    "kms:Describe*",
                ],
                resources=["*"],
                conditions={
                    "ArnLike": {
                        "kms:EncryptionContext:aws:logs:arn": (
                            f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:*"
                        )
                    }
                },
            )
        )
        self.control_plane = logs.LogGroup(
            self,
            "ControlPlane",
            log_group_name=control_plane_log_group_name(cluster_name),
            retention=CONTROL_PLANE_LOG_RETENTION,
            encryption_key=self.key,
            removal_policy=RemovalPolicy.DESTROY,
        )
