"""Deployed stack outputs (CloudFormation) -> the job values that depend on them.

Only the fields the stack decides are written (image repository, namespace, service account, PVC,
bucket and prefix, Region, instance profile); everything else in the user's values file, comments and key
order included, is kept (ruamel.yaml round-trip).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nvrx_eks.infra.ops.aws import aws_errors, error_code
from nvrx_eks.infra.outputs import OUTPUT_KEYS
from nvrx_eks.infra.revision import image_revision
from nvrx_eks.k8s.names import STORE_IMAGE_TAG_SUFFIX
from nvrx_eks.kitcore.configio import UserError, read_text

if TYPE_CHECKING:
    from pathlib import Path

    from nvrx_eks.infra.ops.aws import AwsSession

# Job values fields -> the stack output each comes from (instance_profile and image are derived).
FIELD_SOURCES: dict[tuple[str, ...], str] = {
    ("namespace",): "TrainingNamespace",
    ("service_account",): "TrainingServiceAccount",
    ("storage", "fsx_pvc"): "CheckpointPvcName",
    ("storage", "s3_bucket"): "CheckpointBucketName",
    ("storage", "s3_prefix"): "CheckpointPrefix",
    # The trainer's AWS SDK needs a region for S3 and STS; pods cannot reach the node's instance
    # metadata (hop limit 1, and the job's NetworkPolicy), where the SDK would otherwise look it up.
    # The chart sets AWS_REGION and AWS_DEFAULT_REGION from it.
    ("aws_region",): "Region",
}
# Where earlier versions of this command wrote the region: the values now refuse it there (the chart
# owns those variables), so a file written then has it moved to `aws_region`.
_REGION_ENV = ("AWS_REGION", "AWS_DEFAULT_REGION")
_SETTLED = ("_COMPLETE",)


@dataclass(frozen=True, kw_only=True)
class StackInfo:
    name: str
    status: str
    outputs: dict[str, str]

    @property
    def cluster_name(self) -> str:
        return self.outputs["ClusterName"]

    @property
    def region(self) -> str:
        return self.outputs["Region"]

    @property
    def admin_role_arn(self) -> str:
        return self.outputs["AdminRoleArn"]

    @property
    def node_check_image(self) -> str:
        return self.outputs["NodeCheckImage"]

    @property
    def node_groups(self) -> dict[str, str]:
        try:
            groups = json.loads(self.outputs["GpuNodeGroups"])
        except json.JSONDecodeError:
            raise UserError(f"stack {self.name}: output GpuNodeGroups is not a JSON object") from None
        if not isinstance(groups, dict):
            raise UserError(f"stack {self.name}: output GpuNodeGroups is not a JSON object")
        return {str(k): str(v) for k, v in groups.items()}


def read_stack(session: AwsSession, stack: str) -> StackInfo:
    """The stack's outputs; a missing stack, one still deploying or lacking kit outputs is a UserError."""
    cfn = session.client("cloudformation")
    with aws_errors("cloudformation:DescribeStacks"):
        try:
            described = cfn.describe_stacks(StackName=stack)["Stacks"][0]
        except Exception as exc:
            if error_code(exc) == "ValidationError" and "does not exist" in str(exc):
                raise UserError(
                    f"stack {stack!r} not found in {session.region}: deploy it (`npx cdk deploy {stack}`) "
                    "or pass the region it is in with --region"
                ) from None
            raise
    status = described["StackStatus"]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    if not status.endswith(_SETTLED) or "ROLLBACK" in status:
        raise UserError(
            f"stack {stack!r} is {status}: wait for the deployment to finish (or fix the failed one) "
            "before reading its outputs"
        )
    missing = [key for key in OUTPUT_KEYS if key not in outputs]
    if missing:
        raise UserError(
            f"stack {stack!r} lacks output(s) {', '.join(missing)}: it was not deployed by this kit's "
            "version; redeploy it with `npx cdk deploy`"
        )
    return StackInfo(name=stack, status=status, outputs=outputs)


def pick_instance_profile(info: StackInfo, *, node_group: str | None, current: str | None) -> str:
    """The instance type the job targets: the chosen node group's, else the only one, else keep `current`."""
    groups = info.node_groups
    if node_group is not None:
        if node_group not in groups:
            raise UserError(
                f"--node-group {node_group!r} is not in stack {info.name}; use one of: {', '.join(groups)}"
            )
        return groups[node_group]
    types = sorted(set(groups.values()))
    if len(types) == 1:
        return types[0]
    if current in types:
        return current
    if not types:
        raise UserError(f"stack {info.name} has no GPU node groups; add one to the cluster config")
    raise UserError(
        f"stack {info.name} has node groups of several instance types ({', '.join(types)}); "
        f"pick one with --node-group ({', '.join(groups)})"
    )


def image_for(repository_uri: str, current: str | None, *, default_tag: str | None = None) -> str:
    """The repository from the stack with the user's tag or digest kept.

    Without one: `default_tag`, else this checkout's image content tag (infra/revision.py), the tag
    `nvrx-eks image push` gives the image built from it. Never `latest`: the repository's tags are
    immutable and a moving tag would say nothing about which trainer a job ran.
    """
    if current:
        name, at, digest = current.partition("@")
        last = name.rsplit("/", 1)[-1]
        tag = last.rsplit(":", 1)[1] if ":" in last else ""
        if at:
            return f"{repository_uri}{f':{tag}' if tag else ''}@{digest}"
        if tag and tag != "latest":
            return f"{repository_uri}:{tag}"
    return f"{repository_uri}:{default_tag or image_revision()}"


def store_image_for(image: str) -> str:
    """The store image `nvrx-eks image push` pushes beside the trainer's `image`: the same repository,
    its tag with the store suffix (no digest: `with_digest` asks ECR for the store tag's own)."""
    name = image.partition("@")[0]
    repository, _, tag = name.rpartition(":")
    return f"{repository}:{tag}{STORE_IMAGE_TAG_SUFFIX}"


_BY_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_NOT_PUSHED = frozenset({"ImageNotFoundException", "RepositoryNotFoundException"})


def with_digest(session: AwsSession, image: str) -> str | None:
    """`image` (REPOSITORY:TAG or REPOSITORY[:TAG]@DIGEST in the stack's ECR repository) pinned to the
    digest ECR holds for it (job values take images by digest only), or None when the repository does
    not hold it: a tag never pushed, or a digest (an example's, another repository's) that is not
    there, or not under that tag."""
    from botocore.exceptions import ClientError  # noqa: PLC0415

    name, at, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    registry, _, repository = name.removesuffix(f":{tag}" if tag else "").partition("/")
    if (at and not _BY_DIGEST.search(image)) or not (at or tag):
        return None
    image_id = {"imageDigest": digest} if at else {"imageTag": tag}
    with aws_errors("ecr:DescribeImages"):
        try:
            details = session.client("ecr").describe_images(
                registryId=registry.split(".", 1)[0], repositoryName=repository, imageIds=[image_id]
            )["imageDetails"]
        except ClientError as exc:
            if error_code(exc) in _NOT_PUSHED:
                return None
            raise
    if not details or (tag and tag not in details[0].get("imageTags", [])):
        return None
    return image if at else f"{image}@{details[0]['imageDigest']}"


def pushed_images(session: AwsSession, info: StackInfo, current: str | None) -> tuple[str, str]:
    """(image, store_image) by digest, both in the stack's repository: the values' own tag or digest
    moved to that repository if it is there, else the tag `nvrx-eks image push` gives this checkout.
    Neither pushed: a UserError naming what was looked for and the commands that push it."""
    repository = info.outputs["ImageRepositoryUri"]
    candidates = [image_for(repository, current)] if current else []
    candidates.append(f"{repository}:{image_revision()}")
    tried = []
    for candidate in dict.fromkeys(candidates):
        image = with_digest(session, candidate)
        store = with_digest(session, store_image_for(candidate))
        if image is not None and store is not None:
            return image, store
        tried.append(candidate if image is None else store_image_for(candidate))
    raise UserError(
        f"image: stack {info.name}'s repository does not hold {' or '.join(tried) or 'an image'}; build "
        f"and push this checkout's images (`nvrx-eks image build && nvrx-eks image push --stack "
        f"{info.name}`), then run this again (it writes the digests ECR gives them)"
    )


def require_node_check_image(session: AwsSession, info: StackInfo) -> None:
    """The deployed node check's image is in the stack's repository; else a UserError: no node would be
    verified, and a job's pods, admitted only to verified nodes, would wait for one until they time out."""
    image = info.node_check_image
    if with_digest(session, image) is not None:
        return
    name = image.partition("@")[0]
    tag = name.rsplit(":", 1)[-1]
    raise UserError(
        f"stack {info.name}'s node check pulls {image}, which its repository does not hold: no node can be "
        f"verified, so the job's pods would stay Pending; push that image (`nvrx-eks image build && "
        f"nvrx-eks image push --stack {info.name}` from a checkout whose images are tagged {tag}: "
        "`nvrx-eks image build --dry-run` prints its tag), or redeploy from the checkout whose images you "
        "pushed (`npx cdk deploy`)"
    )


def stack_updates(info: StackInfo, current: dict[str, Any], *, node_group: str | None) -> dict[str, Any]:
    """The nested values the stack decides, given the file's current values."""
    updates: dict[str, Any] = {
        "instance_profile": pick_instance_profile(
            info, node_group=node_group, current=current.get("instance_profile")
        ),
    }
    for path, key in FIELD_SOURCES.items():
        node = updates
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = info.outputs[key]
    return updates


def _yaml() -> Any:  # noqa: ANN401 - ruamel.yaml.YAML
    from ruamel.yaml import YAML  # noqa: PLC0415

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def load_roundtrip(path: Path) -> Any:  # noqa: ANN401 - ruamel CommentedMap
    from ruamel.yaml.comments import CommentedMap  # noqa: PLC0415
    from ruamel.yaml.error import YAMLError  # noqa: PLC0415

    if not path.exists():
        return CommentedMap()
    text = read_text(path, what="job values YAML file")
    try:
        data = _yaml().load(text)
    except YAMLError as exc:
        # ruamel's marked errors carry the problem and where; its str() adds a page of context.
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise UserError(f"{path}: not valid YAML ({where}{problem})") from None
    if data is None:
        return CommentedMap()
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of fields at the top level")
    return data


def apply_updates(doc: Any, updates: dict[str, Any], prefix: str = "") -> list[str]:  # noqa: ANN401
    """Set `updates` into the round-trip document in place; returns the dotted fields that changed."""
    from ruamel.yaml.comments import CommentedMap  # noqa: PLC0415

    changed: list[str] = []
    for key, value in updates.items():
        if isinstance(value, dict):
            if not isinstance(doc.get(key), dict):
                doc[key] = CommentedMap()
            changed += apply_updates(doc[key], value, prefix=f"{prefix}{key}.")
        elif doc.get(key) != value:
            doc[key] = value
            changed.append(f"{prefix}{key}")
    return changed


def drop_region_env(doc: Any) -> list[str]:  # noqa: ANN401 - ruamel CommentedMap
    """Remove env.AWS_REGION / env.AWS_DEFAULT_REGION (now `aws_region`, set from the stack); an env
    left empty goes too. Returns the dotted fields removed."""
    env = doc.get("env")
    if not isinstance(env, dict):
        return []
    removed = [f"env.{key}" for key in _REGION_ENV if key in env]
    for key in _REGION_ENV:
        env.pop(key, None)
    if removed and not env:
        del doc["env"]
    return removed


def dump_roundtrip(doc: Any, path: Path) -> None:  # noqa: ANN401
    from io import StringIO  # noqa: PLC0415

    buffer = StringIO()
    _yaml().dump(doc, buffer)
    path.write_text(buffer.getvalue())


def plain(doc: Any) -> Any:  # noqa: ANN401
    """The round-trip document as plain dicts/lists (for pydantic)."""
    if isinstance(doc, dict):
        return {str(k): plain(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [plain(v) for v in doc]
    return doc
