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

from aws_cdk import RemovalPolicy

# DeletionPolicy RetainExceptOnCreate, UpdateReplacePolicy Retain.
KEEP_UNLESS_CREATE_FAILS = RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE
