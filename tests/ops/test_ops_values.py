"""`nvrx-eks values`: CloudFormation outputs (moto) -> job values, the user's file round-tripped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from nvrx_eks.infra.ops import commands
from nvrx_eks.infra.ops.stack_values import OUTPUT_KEYS, image_for
from nvrx_eks.infra.revision import image_revision
from nvrx_eks.k8s.values import JobValues
from nvrx_eks.kitcore.configio import UserError

REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com/nvrx-eks/trainer"
OUTPUTS = {
    "ClusterName": "nvrx-eks",
    "Region": "us-east-1",
    "FsxFileSystemId": "fs-0123456789abcdef0",
    "FsxDnsName": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
    "FsxMountName": "abcdefgh",
    "CheckpointPvcName": "fsx-ckpt",
    "CheckpointBucketName": "nvrx-eks-checkpoints-123456789012",
    "CheckpointPrefix": "ckpt/",
    "ImageRepositoryUri": REPO,
    "TrainingNamespace": "train",
    "TrainingServiceAccount": "trainer",
    "GpuNodeGroups": json.dumps({"p5-ondemand": "p5.48xlarge"}),
    "AdminRoleArn": "arn:aws:iam::123456789012:role/nvrx-eks-admin",
    "NodeCheckImage": f"{REPO}:0123abcd4567",
}


def _deploy(session, outputs: dict[str, str], name: str = "nvrx-eks") -> None:
    template = {
        "Resources": {"Bucket": {"Type": "AWS::S3::Bucket"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    session.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


@pytest.fixture
def cli(moto_session, monkeypatch):
    monkeypatch.setattr(commands, "_session", lambda profile, region: moto_session)
    app = typer.Typer()
    job = typer.Typer()
    app.add_typer(job, name="job")
    commands.register(app=app, job=job)

    def invoke(*args: str):
        return CliRunner().invoke(app, list(args))

    return invoke


USER_FILE = """\
# my training job
name: llama-ft   # keep this name
num_nodes: 2
image: local
mode: ft_launcher
entrypoint:
  args: [--model, small, --steps, "5000"]
trainer:
  checkpoint:
    memory_every: 5
storage:
  local_nvme_path: /mnt/k8s-disks/0/nvrx-checkpoints   # node NVMe
"""


def _push(session, tag: str, *, store: bool = True) -> str:
    """What `nvrx-eks image push` leaves in the stack's repository: the trainer's tag and the store's
    `<tag>-store` beside it; returns the digest ECR gives the trainer's."""
    ecr = session.client("ecr")
    repository = REPO.split("/", 1)[1]
    ecr.create_repository(repositoryName=repository)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": []}
    digests = [
        ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag=each)["image"][
            "imageId"
        ]["imageDigest"]
        for each in ((tag, f"{tag}-store") if store else (tag,))
    ]
    return digests[0]


def test_outputs_fill_the_stack_fields_and_keep_everything_else(cli, moto_session, tmp_path):
    _deploy(moto_session, OUTPUTS)
    digest = _push(moto_session, image_revision())
    path = tmp_path / "values.yaml"
    path.write_text(USER_FILE)
    result = cli("values", "--stack", "nvrx-eks", "-o", str(path))
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert "# my training job" in text
    assert "# keep this name" in text
    assert "# node NVMe" in text
    data = yaml.safe_load(text)
    assert data["name"] == "llama-ft"
    assert data["entrypoint"] == {"args": ["--model", "small", "--steps", "5000"]}
    assert data["trainer"] == {"checkpoint": {"memory_every": 5}}
    assert data["mode"] == "ft_launcher"
    # No tag in the file: this checkout's revision, the tag `nvrx-eks image push` gives its image, with
    # the digest ECR gives that tag (job values take images by digest only).
    assert data["image"] == f"{REPO}:{image_revision()}@{digest}"
    # The store's small image, pushed beside it as `<tag>-store`, by its own digest.
    assert data["store_image"] == f"{REPO}:{image_revision()}-store@{digest}"
    assert data["namespace"] == "train"
    assert data["service_account"] == "trainer"
    assert data["instance_profile"] == "p5.48xlarge"
    assert data["storage"] == {
        "local_nvme_path": "/mnt/k8s-disks/0/nvrx-checkpoints",
        "fsx_pvc": "fsx-ckpt",
        "s3_bucket": "nvrx-eks-checkpoints-123456789012",
        "s3_prefix": "ckpt/",
    }
    # The trainer's SDK reads the region from its env (the chart sets it from aws_region): pods cannot
    # reach the node's instance metadata.
    assert data["aws_region"] == OUTPUTS["Region"]
    assert "env" not in data
    JobValues.model_validate(data)
    # Running it again changes nothing.
    again = cli("values", "--stack", "nvrx-eks", "-o", str(path))
    assert "nothing (already up to date)" in again.output
    assert path.read_text() == text


def test_a_region_in_env_written_by_an_earlier_version_moves_to_aws_region(cli, moto_session, tmp_path):
    _deploy(moto_session, OUTPUTS)
    _push(moto_session, image_revision())
    path = tmp_path / "values.yaml"
    path.write_text(USER_FILE + "env:\n  AWS_REGION: us-east-1\n  OMP_NUM_THREADS: 8\n")
    result = cli("values", "--stack", "nvrx-eks", "-o", str(path))
    assert result.exit_code == 0, result.output
    assert "env.AWS_REGION (removed: now aws_region)" in result.output
    data = yaml.safe_load(path.read_text())
    assert (data["aws_region"], data["env"]) == ("us-east-1", {"OMP_NUM_THREADS": 8})
    JobValues.model_validate(data)


def test_a_new_file_gets_the_stack_fields_and_names_what_is_left(cli, moto_session, tmp_path):
    _deploy(moto_session, OUTPUTS)
    _push(moto_session, image_revision())
    path = tmp_path / "new.yaml"
    result = cli("values", "--stack", "nvrx-eks", "-o", str(path))
    assert result.exit_code == 0, result.output
    assert "still to fill in before `nvrx-eks job submit`: name, num_nodes" in result.output
    assert yaml.safe_load(path.read_text())["storage"]["fsx_pvc"] == "fsx-ckpt"


EXAMPLE_IMAGE = f"{REPO}:0123abcd4567@sha256:{'01' * 32}"


def test_images_not_in_the_repository_are_refused_naming_the_push(cli, moto_session, tmp_path):
    # Nothing pushed: the example's tag and digest, moved onto the stack's repository, would name an
    # image no node can pull; the file stays as it was and the message says what pushes one.
    _deploy(moto_session, OUTPUTS)
    path = tmp_path / "v.yaml"
    original = f"name: a\nnum_nodes: 1\nimage: {EXAMPLE_IMAGE}\n"
    path.write_text(original)
    result = cli("values", "--stack", "nvrx-eks", "-o", str(path))
    assert result.exit_code == 2, result.output
    assert (
        f"image: stack nvrx-eks's repository does not hold {EXAMPLE_IMAGE} or {REPO}:{image_revision()};"
        in (" ".join(result.output.split()))
    )
    assert "nvrx-eks image build && nvrx-eks image push --stack nvrx-eks" in result.output
    assert path.read_text() == original


def test_an_examples_digest_gives_way_to_this_checkouts_pushed_images(cli, moto_session, tmp_path):
    _deploy(moto_session, OUTPUTS)
    digest = _push(moto_session, image_revision())
    path = tmp_path / "v.yaml"
    path.write_text(f"name: a\nnum_nodes: 1\nimage: {EXAMPLE_IMAGE}\nstore_image: {EXAMPLE_IMAGE}\n")
    result = cli("values", "--stack", "nvrx-eks", "-o", str(path))
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(path.read_text())
    assert data["image"] == f"{REPO}:{image_revision()}@{digest}"
    assert data["store_image"].startswith(f"{REPO}:{image_revision()}-store@sha256:")


def test_a_pushed_tag_the_file_names_is_kept_and_its_store_must_be_there(cli, moto_session, tmp_path):
    _deploy(moto_session, OUTPUTS)
    digest = _push(moto_session, "v3")
    path = tmp_path / "v.yaml"
    path.write_text("name: a\nnum_nodes: 1\nimage: old.example.com/team/trainer:v3\n")
    result = cli("values", "--stack", "nvrx-eks", "-o", str(path))
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(path.read_text())["image"] == f"{REPO}:v3@{digest}"


def test_missing_stack_is_a_user_error(cli, tmp_path):
    result = cli("values", "--stack", "nope", "-o", str(tmp_path / "v.yaml"))
    assert result.exit_code == 2
    assert "stack 'nope' not found in us-east-1" in result.output
    assert not (tmp_path / "v.yaml").exists()


def test_stack_without_the_kit_outputs_names_them(cli, moto_session, tmp_path):
    _deploy(
        moto_session, {k: v for k, v in OUTPUTS.items() if k not in {"GpuNodeGroups", "CheckpointPvcName"}}
    )
    result = cli("values", "--stack", "nvrx-eks", "-o", str(tmp_path / "v.yaml"))
    assert result.exit_code == 2
    assert "lacks output(s) CheckpointPvcName, GpuNodeGroups" in result.output


def test_several_node_group_types_need_a_choice(cli, moto_session, tmp_path):
    groups = {"g6-dev": "g6.8xlarge", "p5-ondemand": "p5.48xlarge"}
    _deploy(moto_session, {**OUTPUTS, "GpuNodeGroups": json.dumps(groups)})
    _push(moto_session, image_revision())
    path = tmp_path / "v.yaml"
    path.write_text("name: a\nnum_nodes: 1\n")
    result = cli("values", "--stack", "nvrx-eks", "-o", str(path))
    assert result.exit_code == 2
    assert "--node-group" in result.output
    result = cli("values", "--stack", "nvrx-eks", "-o", str(path), "--node-group", "g6-dev")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(path.read_text())["instance_profile"] == "g6.8xlarge"


def test_values_that_stop_validating_are_refused(cli, moto_session, tmp_path):
    _deploy(moto_session, OUTPUTS)
    _push(moto_session, image_revision())
    path = tmp_path / "v.yaml"
    original = "name: a\nnum_nodes: 0\n"
    path.write_text(original)
    result = cli("values", "--stack", "nvrx-eks", "-o", str(path))
    assert result.exit_code == 2
    assert "num_nodes" in result.output
    assert path.read_text() == original


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (None, f"{REPO}:0123abcd4567"),
        ("local", f"{REPO}:0123abcd4567"),
        ("old.example.com/team/trainer:v3", f"{REPO}:v3"),
        ("old.example.com/team/trainer:latest", f"{REPO}:0123abcd4567"),
        ("localhost:5000/trainer", f"{REPO}:0123abcd4567"),
        ("x/trainer@sha256:abc", f"{REPO}@sha256:abc"),
        ("x/trainer:v3@sha256:abc", f"{REPO}:v3@sha256:abc"),
    ],
)
def test_image_keeps_the_users_tag_or_digest(current, expected):
    assert image_for(REPO, current, default_tag="0123abcd4567") == expected


def test_image_without_a_tag_is_never_latest():
    assert image_for(REPO, None) == f"{REPO}:{image_revision()}"
    assert image_for(REPO, "x:latest") == f"{REPO}:{image_revision()}"
    assert image_for(REPO, "local") == f"{REPO}:{image_revision()}"


def test_example_values_name_no_moving_tag():
    for path in sorted((Path(__file__).resolve().parents[2] / "k8s" / "values").glob("*.yaml")):
        image = yaml.safe_load(path.read_text())["image"]
        assert not image.endswith(":latest"), path.name
        assert image == "local" or ":" in image.rsplit("/", 1)[-1] or "@sha256:" in image, path.name


def test_contract_output_keys():
    # The stack writes exactly the keys the job tooling reads (infra/outputs.py).
    assert set(OUTPUT_KEYS) == set(OUTPUTS)


def test_job_status_without_a_name_or_values_names_both_ways(cli):
    result = cli("job", "status")
    assert result.exit_code == 2
    assert "name the job: `nvrx-eks job status NAME`, or `-f VALUES`" in result.output


def test_the_admin_role_is_assumed_for_the_clusters_api(moto_session):
    # `job submit/status --stack` sign the EKS token as the stack's admin role (its access entry).
    role = moto_session.client("iam").create_role(RoleName="nvrx-eks-admin", AssumeRolePolicyDocument="{}")
    admin = moto_session.assume(role["Role"]["Arn"])
    caller = admin.client("sts").get_caller_identity()["Arn"]
    assert caller.startswith("arn:aws:sts::123456789012:assumed-role/nvrx-eks-admin/nvrx-eks")
    assert admin.region == moto_session.region


def test_a_node_check_image_the_repository_lacks_is_named_before_a_job_is_submitted(moto_session):
    from nvrx_eks.infra.ops.stack_values import read_stack, require_node_check_image  # noqa: PLC0415

    _deploy(moto_session, OUTPUTS)
    info = read_stack(moto_session, "nvrx-eks")
    # Deployed with image inputs tagged 0123abcd4567, images pushed from others: no node could be verified.
    _push(moto_session, "fedcba987654")
    with pytest.raises(UserError) as refused:
        require_node_check_image(moto_session, info)
    assert f"node check pulls {REPO}:0123abcd4567, which its repository does not hold" in str(refused.value)
    assert (
        "nvrx-eks image push --stack nvrx-eks` from a checkout whose images are tagged 0123abcd4567"
        in " ".join(str(refused.value).split())
    )
    ecr = moto_session.client("ecr")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": []}
    ecr.put_image(
        repositoryName=REPO.split("/", 1)[1], imageManifest=json.dumps(manifest), imageTag="0123abcd4567"
    )
    require_node_check_image(moto_session, info)
