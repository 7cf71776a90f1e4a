"""What the stack keeps when it is deleted, and what a failed first deploy leaves behind.

Data and what decrypts it (the checkpoint file system, the image repository, the KMS keys) outlive a
`cdk destroy` or a replacement. A create that fails and rolls back has written nothing into them: a
`Retain` policy would keep them anyway, billing (FSx) or blocking the retry (a fixed name), so they
are retained except on create (CloudFormation `DeletionPolicy: RetainExceptOnCreate`,
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-attribute-deletionpolicy.html).
The rollback deletes them only if nothing wrote what a delete refuses to drop: no image is pushed and
no checkpoint written before the deploy ends, and the access-log bucket lets S3's log delivery in only
after every other resource exists (infra/constructs/storage.py `deliver_access_logs_after`).
tests/infra check the template over every retained resource and every point a create can fail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import RemovalPolicy
from aws_cdk import aws_kms as kms

if TYPE_CHECKING:
    from constructs import Construct

# DeletionPolicy RetainExceptOnCreate, UpdateReplacePolicy Retain.
KEEP_UNLESS_CREATE_FAILS = RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE


def kept_key(scope: Construct, id: str, *, description: str) -> kms.Key:  # noqa: A002
    """A customer-managed KMS key with yearly rotation, kept as long as the data it decrypts."""
    return kms.Key(
        scope,
        id,
        enable_key_rotation=True,
        description=description,
        removal_policy=KEEP_UNLESS_CREATE_FAILS,
    )
