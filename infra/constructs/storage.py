"""Durable storage for training: FSx for Lustre linked to an S3 checkpoint bucket, and the image registry.

Tiers (docs/architecture.md, docs/aws.md): host RAM and node-local NVMe live on the nodes; this construct
provides the durable ones. FSx is the fast shared tier, exported to S3 by a data repository
association (DRA), so a checkpoint written to /durable on FSx also lands in the bucket.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct, IConstruct

from nvrx_eks.infra.constructs.retention import KEEP_UNLESS_CREATE_FAILS, kept_key

# Lustre client traffic: 988 and 1018-1023 (TCP), from clients and between file servers.
# https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))
# The service-linked role FSx creates per file system to reach a linked bucket.
# https://docs.aws.amazon.com/fsx/latest/LustreGuide/setting-up.html#fsx-adding-permissions-s3
FSX_S3_ROLE_PATH = "role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/*"


class LustreClientSecurityGroup(ec2.SecurityGroup):
    """For the file system's clients (GPU nodes): Lustre traffic from the file system's servers.

    LNet connects in both directions, so clients accept 988 and 1018-1023 from the file system's
    security group (https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html).
    """

    def __init__(self, scope: Construct, id: str, *, vpc: ec2.IVpc) -> None:  # noqa: A002
        super().__init__(
            scope, id, vpc=vpc, description="FSx for Lustre clients: traffic from the file servers"
        )

    def allow_file_system(self, file_system_group: ec2.ISecurityGroup) -> None:
        for port in LUSTRE_PORTS:
            self.add_ingress_rule(file_system_group, port, "Lustre: FSx file servers to clients")


class DurableStorage(Construct):
    """KMS key, checkpoint bucket (+ access-log bucket), FSx PERSISTENT_2 + DRA, ECR repository.

    Needs the app's feature flag @aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy (infra/app.py):
    ACLs are disabled on both buckets, so log delivery is granted by bucket policy.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,  # noqa: A002
        *,
        vpc: ec2.IVpc,
        fsx_subnet: ec2.ISubnet,
        client_cidr: str,
        storage_capacity_gib: int,
        throughput_per_tib: int,
        file_system_path: str,
        data_repository_path: str | None,
        checkpoint_prefix: str,
        noncurrent_version_days: int,
        expire_days: int | None,
        retain_bucket: bool,
        repository_name: str | None,
        keep_images: int | None,
    ) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.key = kept_key(
            self, "DataKey", description="nvrx-eks: checkpoints (S3, FSx) and training images (ECR)"
        )
        self._allow_fsx_s3_role(stack)
        self.bucket, self.access_logs = self._buckets(
            prefix=checkpoint_prefix,
            noncurrent_version_days=noncurrent_version_days,
            expire_days=expire_days,
            retain=retain_bucket,
        )
        self.checkpoint_prefix = checkpoint_prefix
        self.file_system = self._file_system(
            vpc=vpc,
            subnet=fsx_subnet,
            client_cidr=client_cidr,
            storage_capacity_gib=storage_capacity_gib,
            throughput_per_tib=throughput_per_tib,
        )
        self.storage_capacity_gib = storage_capacity_gib
        self.data_repository_path = (
            data_repository_path or f"s3://{self.bucket.bucket_name}/{checkpoint_prefix}"
        )
        self.association = fsx.CfnDataRepositoryAssociation(
            self,
            "S3Association",
            file_system_id=self.file_system.file_system_id,
            file_system_path=file_system_path,
            data_repository_path=self.data_repository_path,
            batch_import_meta_data_on_create=True,
            # Both directions: checkpoints written on FSx are exported to S3 (durable beyond the
            # file system); objects that appear in S3 (datasets, restores) show up on FSx.
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(
                    events=["NEW", "CHANGED", "DELETED"]
                ),
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                    events=["NEW", "CHANGED", "DELETED"]
                ),
            ),
        )
        self.repository = ecr.Repository(
            self,
            "Images",
            repository_name=repository_name,
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.KMS,
            encryption_key=self.key,
            removal_policy=KEEP_UNLESS_CREATE_FAILS,
            # Tagged images stay unless the config caps them: ECR cannot tell which ones a deployed
            # object (a job's pods, the node check) still pulls, and a node that joins later needs
            # them; each push adds two (trainer and store).
            lifecycle_rules=[
                ecr.LifecycleRule(
                    rule_priority=1,
                    description="drop untagged layers of failed pushes",
                    tag_status=ecr.TagStatus.UNTAGGED,
                    max_image_age=Duration.days(1),
                ),
                *(
                    [
                        ecr.LifecycleRule(
                            rule_priority=2,
                            description=f"keep the newest {keep_images} images",
                            tag_status=ecr.TagStatus.ANY,
                            max_image_count=keep_images,
                        )
                    ]
                    if keep_images
                    else []
                ),
            ],
        )

    def deliver_access_logs_after(self, *others: IConstruct) -> None:
        """Grant S3 log delivery into the access-log bucket only once `others` exist.

        The bucket outlives the stack but not a failed create (RetainExceptOnCreate), and a rollback
        can delete it only while it is empty. S3 delivers server access logs within hours of the
        requests, and the checkpoint bucket logs from its first minute: a create that fails late (the
        cluster, the file system, the charts' waits take long) could leave logs there, the rollback's
        delete fail and the retry wait for a hand-emptied bucket. Delivery is allowed by the bucket
        policy alone (ACLs are off): made after every other resource of the stack, it lets no log in
        before the create has succeeded, and an undelivered log is dropped, not queued. Its TLS-only
        statement comes with it: nothing reads or writes the empty bucket before then.
        https://docs.aws.amazon.com/AmazonS3/latest/userguide/ServerLogs.html
        """
        policy = self.access_logs.policy
        if policy is None:  # the bucket's log-delivery grant made one (the app's feature flag)
            raise RuntimeError("the access-log bucket has no policy to grant log delivery with")
        for other in others:
            policy.node.add_dependency(other)

    def _allow_fsx_s3_role(self, stack: Stack) -> None:
        # FSx reaches the SSE-KMS bucket through its per-file-system service-linked role, whose own
        # policy has no KMS rights: the key policy must grant them, and only via S3 in this account.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="FsxDataRepositoryViaS3",
                principals=[iam.AnyPrincipal()],
                actions=[
                    "kms:Decrypt",
                    "kms:Encrypt",
                    "kms:GenerateDataKey*",
                    "kms:ReEncrypt*",
                    "kms:DescribeKey",
                ],
                resources=["*"],
                conditions={
                    "StringEquals": {
                        "kms:CallerAccount": stack.account,
                        "kms:ViaService": f"s3.{stack.region}.amazonaws.com",
                    },
                    "ArnLike": {
                        "aws:PrincipalArn": f"arn:{stack.partition}:iam::{stack.account}:{FSX_S3_ROLE_PATH}"
                    },
                },
            )
        )

    def _buckets(
        self, *, prefix: str, noncurrent_version_days: int, expire_days: int | None, retain: bool
    ) -> tuple[s3.Bucket, s3.Bucket]:
        removal = KEEP_UNLESS_CREATE_FAILS if retain else RemovalPolicy.DESTROY
        # Server access logs cannot be delivered to an SSE-KMS bucket: S3-managed keys here.
        access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=removal,
            auto_delete_objects=False,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(90))],
        )
        bucket = s3.Bucket(
            self,
            "Checkpoints",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=access_logs,
            server_access_logs_prefix="checkpoints/",
            removal_policy=removal,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="checkpoint-versions",
                    prefix=prefix,
                    noncurrent_version_expiration=Duration.days(noncurrent_version_days),
                    expiration=Duration.days(expire_days) if expire_days else None,
                ),
                s3.LifecycleRule(
                    id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=Duration.days(7)
                ),
            ],
        )
        return bucket, access_logs

    def _file_system(
        self,
        *,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        client_cidr: str,
        storage_capacity_gib: int,
        throughput_per_tib: int,
    ) -> fsx.LustreFileSystem:
        security_group = self.security_group = ec2.SecurityGroup(
            self,
            "FsxSecurityGroup",
            vpc=vpc,
            description="FSx for Lustre: clients in the VPC and file servers",
        )
        for port in LUSTRE_PORTS:
            security_group.add_ingress_rule(ec2.Peer.ipv4(client_cidr), port, "Lustre clients in the VPC")
            security_group.add_ingress_rule(security_group, port, "Lustre file servers")
        return fsx.LustreFileSystem(
            self,
            "Lustre",
            vpc=vpc,
            vpc_subnet=subnet,
            storage_capacity_gib=storage_capacity_gib,
            kms_key=self.key,
            security_group=security_group,
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            removal_policy=KEEP_UNLESS_CREATE_FAILS,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=fsx.LustreDeploymentType.PERSISTENT_2,
                per_unit_storage_throughput=throughput_per_tib,
                # Checkpoints of bf16/fp32 tensors compress modestly with LZ4 at no throughput cost.
                data_compression_type=fsx.LustreDataCompressionType.LZ4,
            ),
        )

    def grant_checkpoint_prefix(self, grantee: iam.IGrantable) -> None:
        """Read/write/delete under the checkpoint prefix only, and list only that prefix."""
        prefix = self.checkpoint_prefix
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="CheckpointObjects",
                actions=[
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts",
                ],
                resources=[self.bucket.arn_for_objects(f"{prefix}*")],
            )
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="CheckpointListing",
                actions=["s3:ListBucket"],
                resources=[self.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}},
            )
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="CheckpointKeyViaS3",
                actions=["kms:Decrypt", "kms:GenerateDataKey"],
                resources=[self.key.key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"s3.{Stack.of(self).region}.amazonaws.com"}},
            )
        )
