"""The stack outputs the job tooling reads, in one place for the stack that writes them and the
boto3 code that reads them (`nvrx-eks values`, `image push`, `job status`). Light on purpose: no
aws_cdk import, so the operator commands stay fast."""

from __future__ import annotations

OUTPUT_KEYS = (
    "ClusterName",
    "Region",
    "FsxFileSystemId",
    "FsxDnsName",
    "FsxMountName",
    "CheckpointPvcName",
    "CheckpointBucketName",
    "CheckpointPrefix",
    "ImageRepositoryUri",
    "TrainingNamespace",
    "TrainingServiceAccount",
    "GpuNodeGroups",
    # The role with the cluster's admin access entry: `nvrx-eks job ... --stack` and
    # `aws eks update-kubeconfig --role-arn` reach the API as it.
    "AdminRoleArn",
    # The image the node check's DaemonSet pulls (REPOSITORY:TAG[@DIGEST]): until the repository
    # holds it no node is verified, so `job submit --stack` checks it first.
    "NodeCheckImage",
)
