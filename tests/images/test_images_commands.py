"""`nvrx-eks image build | push | lock`: the command lines they produce and run (no Docker here)."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from nvrx_eks.images import build
from nvrx_eks.infra.revision import image_revision, source_revision
from nvrx_eks.kitcore import pins
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.pins import IMAGE, STORE_IMAGE

URI = "123456789012.dkr.ecr.us-west-2.amazonaws.com/nvrx-eks-training"


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """A `docker` on PATH that records each argv (and stdin) as one JSON line."""
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "bin" / "docker"
    script.parent.mkdir()
    script.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], 'stdin': "
        "'' if sys.stdin.isatty() else sys.stdin.read()}) + '\\n')\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")

    def calls() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return calls


VERIFIED = dataclasses.replace(IMAGE, efa_installer_sha256="a" * 64, aws_ofi_nccl_sha256="b" * 64)
STORE_VERIFIED = dataclasses.replace(STORE_IMAGE, torch_sha256="c" * 64)


UNPINNED = dataclasses.replace(
    IMAGE,
    base_digest=pins.UNPUBLISHED_SHA256,
    efa_installer_sha256=pins.UNPUBLISHED_SHA256,
    aws_ofi_nccl_sha256=pins.UNPUBLISHED_SHA256,
)


def test_build_refuses_unverified_downloads_before_running_the_engine(image_app, fake_engine, monkeypatch):
    # Until `nvrx-eks image pin` has run, the pins hold placeholders.
    monkeypatch.setattr(pins, "IMAGE", UNPINNED)
    monkeypatch.setattr(pins, "STORE_IMAGE", STORE_IMAGE)
    result = CliRunner().invoke(image_app, ["image", "build", "--tag", "t0"])
    assert isinstance(result.exception, UserError)
    message = str(result.exception)
    assert "efa_installer_sha256 is 'unpublished', not a sha256" in message
    assert "aws_ofi_nccl_sha256" in message
    assert "base_digest is 'unpublished'" in message
    # The store image's torch wheel too (its checksum is recorded by the same command).
    assert "STORE_IMAGE.torch_sha256 is 'unpublished', not a sha256" in message
    # It says what to run, and names no file that does not exist.
    assert "Run `nvrx-eks image pin` once on a machine with internet" in message
    for path in re.findall(r"[\w/.-]+\.(?:py|sh|md)\b", message):
        assert (build.REPO_ROOT / path).exists(), f"the message names {path}, which does not exist"
    assert fake_engine() == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"base_digest": "25.09-py3"}, "base_digest is '25.09-py3', not sha256:"),
        ({"aws_ofi_nccl_sha256": "A" * 64}, "aws_ofi_nccl_sha256 is 'AAAA"),
    ],
)
def test_a_tag_only_base_or_a_malformed_checksum_is_refused(change, problem):
    with pytest.raises(UserError, match=problem):
        build.check_verifiable(dataclasses.replace(VERIFIED, **change), STORE_VERIFIED)
    build.check_verifiable(VERIFIED, STORE_VERIFIED)  # the same pins, verified, pass
    with pytest.raises(UserError, match=re.escape("STORE_IMAGE.base_digest is '3.12-slim-trixie'")):
        build.check_verifiable(VERIFIED, dataclasses.replace(STORE_VERIFIED, base_digest="3.12-slim-trixie"))


def test_build_runs_the_engine_with_every_pin_as_a_build_arg(image_app, fake_engine, monkeypatch):
    monkeypatch.setattr(pins, "IMAGE", VERIFIED)
    monkeypatch.setattr(pins, "STORE_IMAGE", STORE_VERIFIED)
    result = CliRunner().invoke(image_app, ["image", "build", "--tag", "t1"])
    assert result.exit_code == 0, result.output
    call, store = fake_engine()
    argv = call["argv"]
    assert argv[:2] == ["build", "--file"]
    assert argv[argv.index("--tag") + 1] == "nvrx-eks-training:t1"
    assert argv[argv.index("--platform") + 1] == "linux/amd64"
    assert argv[-1] == str(build.REPO_ROOT)
    passed = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")
    # The revision label is the commit built from; the tag is --tag (by default the images' content tag).
    assert passed == build.build_args(git_revision=source_revision() or "unknown", pins=VERIFIED)
    assert passed["NVRX_VERSION"] == IMAGE.nvrx_version
    assert passed["BASE_IMAGE"] == IMAGE.base_image
    assert passed["EFA_INSTALLER_SHA256"] == "a" * 64
    # The store's small image, from its own Dockerfile and pins, tagged beside the trainer's.
    argv = store["argv"]
    assert argv[argv.index("--file") + 1] == str(build.STORE_DOCKERFILE)
    assert argv[argv.index("--tag") + 1] == "nvrx-eks-training:t1-store"
    passed = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")
    assert passed == build.store_build_args(git_revision=source_revision() or "unknown", pins=STORE_VERIFIED)
    assert passed["TORCH_SHA256"] == "c" * 64
    assert passed["NVRX_VERSION"] == IMAGE.nvrx_version
    assert result.stdout.split() == ["nvrx-eks-training:t1", "nvrx-eks-training:t1-store"]


def test_the_default_tag_is_the_images_content_tag(image_app, fake_engine):
    result = CliRunner().invoke(image_app, ["image", "build", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [
        f"nvrx-eks-training:{image_revision()}",
        f"nvrx-eks-training:{image_revision()}-store",
    ]


def test_dry_run_prints_the_command_and_runs_nothing(image_app, fake_engine):
    result = CliRunner().invoke(
        image_app, ["image", "build", "--tag", "t2", "--dry-run", "--engine", "finch"]
    )
    assert result.exit_code == 0, result.output
    assert fake_engine() == []
    printed = next(line for line in result.stderr.splitlines() if line.startswith("$ "))
    assert shlex.split(printed[2:])[:2] == ["finch", "build"]


def test_the_tag_defaults_to_the_git_revision(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f").write_text("1")
    git("add", "f")
    git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "c")
    commit = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert build.git_revision(tmp_path) == commit
    (tmp_path / "f").write_text("2")
    assert build.git_revision(tmp_path) == f"{commit}-dirty"
    with pytest.raises(UserError, match="not a git checkout"):
        build.git_revision(tmp_path / "nowhere")


def test_push_logs_in_with_the_password_on_stdin_then_tags_and_pushes(image_app, fake_engine, monkeypatch):
    from nvrx_eks.infra.ops import stack_values  # noqa: PLC0415

    # The registry holds the tags only after the (fake) push: before it, neither is there.
    monkeypatch.setattr(stack_values, "with_digest", lambda *_: None)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        # What the engine's push leaves in the registry (the fake engine pushes nothing).
        ecr = boto3.client("ecr")
        ecr.create_repository(repositoryName=URI.split("/", 1)[1])
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "layers": [],
        }
        pushed, pushed_store = (
            ecr.put_image(
                repositoryName=URI.split("/", 1)[1],
                imageManifest=json.dumps(manifest),
                imageTag=tag,
            )["image"]["imageId"]["imageDigest"]
            for tag in ("t3", "t3-store")
        )
        result = CliRunner().invoke(image_app, ["image", "push", "--repository", URI, "--tag", "t3"])
        token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    assert result.exit_code == 0, result.output
    login, tag, push, tag_store, push_store = fake_engine()
    registry = URI.split("/", 1)[0]
    assert login["argv"] == ["login", "--username", "AWS", "--password-stdin", registry]
    password = base64.b64decode(token).decode().partition(":")[2]
    assert login["stdin"] == password
    assert password not in " ".join(login["argv"])
    assert tag["argv"] == ["tag", "nvrx-eks-training:t3", f"{URI}:t3"]
    assert push["argv"] == ["push", f"{URI}:t3"]
    assert tag_store["argv"] == ["tag", "nvrx-eks-training:t3-store", f"{URI}:t3-store"]
    assert push_store["argv"] == ["push", f"{URI}:t3-store"]
    # The job values' image and store_image: tags and the digests the registry gave the pushed tags.
    assert result.stdout.split()[-2:] == [f"{URI}:t3@{pushed}", f"{URI}:t3-store@{pushed_store}"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", pushed)


def test_push_keeps_a_tag_the_repository_holds_and_prints_its_digest(image_app, fake_engine, monkeypatch):
    """The repository's tags are immutable and the default tag names the images' inputs: a tag it holds
    names an image built from the same inputs, so the push keeps it instead of failing."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ecr = boto3.client("ecr")
        ecr.create_repository(repositoryName=URI.split("/", 1)[1], imageTagMutability="IMMUTABLE")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "layers": [],
        }
        held = ecr.put_image(
            repositoryName=URI.split("/", 1)[1], imageManifest=json.dumps(manifest), imageTag="t6"
        )["image"]["imageId"]["imageDigest"]
        result = CliRunner().invoke(
            image_app, ["image", "push", "--repository", URI, "--tag", "t6", "--no-store"]
        )
    assert result.exit_code == 0, result.output
    assert [call["argv"][0] for call in fake_engine()] == ["login"]
    assert f"{URI}:t6 is in the repository already: kept, not pushed again" in result.stderr
    assert result.stdout.split() == [f"{URI}:t6@{held}"]


def test_push_reads_the_repository_from_the_stack_outputs(image_app, fake_engine, monkeypatch):
    from nvrx_eks.infra.ops import stack_values  # noqa: PLC0415

    seen = {}

    def read_stack(session, stack):
        seen["stack"] = stack
        return stack_values.StackInfo(
            name=stack, status="CREATE_COMPLETE", outputs={"ImageRepositoryUri": URI}
        )

    monkeypatch.setattr(stack_values, "read_stack", read_stack)
    result = CliRunner().invoke(
        image_app, ["image", "push", "--stack", "nvrx-eks", "--tag", "t4", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert seen["stack"] == "nvrx-eks"
    assert f"$ docker push {URI}:t4" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tag", "t"], "exactly one of --stack"),
        (["--repository", "docker.io/library/x", "--tag", "t", "--dry-run"], "not an ECR repository URI"),
        (["--repository", URI, "--tag", "bad tag", "--dry-run"], "not a valid image tag"),
    ],
)
def test_push_refuses_bad_input_with_one_message(image_app, args, message):
    result = CliRunner().invoke(image_app, ["image", "push", *args])
    assert isinstance(result.exception, UserError)
    assert message in str(result.exception)


def test_no_engine_on_path_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="no container engine found"):
        build.find_engine()
    with pytest.raises(UserError, match="not supported"):
        build.find_engine("nerdctl")


def test_build_takes_podman_where_docker_is_absent_and_says_so(image_app, tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "bin" / "podman"
    script.parent.mkdir()
    record = f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n{record}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(script.parent))  # no docker, no finch
    monkeypatch.setattr(pins, "IMAGE", VERIFIED)
    monkeypatch.setattr(pins, "STORE_IMAGE", STORE_VERIFIED)
    result = CliRunner().invoke(image_app, ["image", "build", "--tag", "t3"])
    assert result.exit_code == 0, result.output
    assert "engine: podman (the first of docker, finch, podman on PATH)" in result.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [argv[0] for argv in calls] == ["build", "build"]
    # Docker's image format: OCI images have no SHELL, and the Dockerfiles' pipefail must hold.
    assert all(argv[argv.index("--format") + 1] == "docker" for argv in calls)


def test_lock_resolves_for_the_image_python_and_splits_torch_from_the_rest():
    argv = build.lock_argv(python="python3", requirements=build.image_requirements())
    assert argv[argv.index("--python-version") + 1] == "3.12"
    assert "manylinux_2_39_x86_64" in argv
    assert "manylinux_2_40_x86_64" not in argv  # newer than the base's glibc
    assert "--isolated" in argv
    assert f"torch=={IMAGE.torch_version}" in argv
    assert f"nvidia-resiliency-ext=={IMAGE.nvrx_version}" in argv
    report = {
        "install": [
            {
                "metadata": {"name": n, "version": v},
                "download_info": {"archive_info": {"hashes": {"sha256": "ab" * 32}}},
            }
            for n, v in (
                ("torch", "2.13.0"),
                ("nvidia-resiliency-ext", "0.7.0"),
                ("nvidia-nccl-cu13", "2.29.7"),
                ("cuda-bindings", "13.5.0"),
                ("Typer", "1"),
            )
        ]
    }
    text = build.render_lock(report, header=build.lock_header())
    assert build.locked_versions(text) == {"nvidia-resiliency-ext": "0.7.0", "typer": "1"}
    assert text.startswith("# The training image's")
    torch_lock = build.render_lock(report, header=build.torch_lock_header(), provided=build.NOT_TORCH)
    assert build.locked_versions(torch_lock) == {
        "torch": "2.13.0",
        "nvidia-nccl-cu13": "2.29.7",
        "cuda-bindings": "13.5.0",
    }


def test_the_lock_file_is_what_the_lock_renderer_writes():
    # The committed lock parses with the same reader the checks use, and its header names the pins.
    text = Path(build.LOCK_FILE).read_text()
    assert f"nvrx: {IMAGE.nvrx_version}" in text
    assert f"base: {IMAGE.base_image}" in text


def _project(tmp_path: Path, *, requirements: bool = True) -> tuple[Path, str]:
    """A training project in git (its own `training` package); (folder, its short commit)."""
    project = tmp_path / "My Project"
    (project / "training").mkdir(parents=True)
    (project / "training" / "__init__.py").write_text("")
    if requirements:
        (project / "requirements.txt").write_text("")
    for args in (
        ("init", "-q"),
        ("add", "."),
        ("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "c"),
    ):
        subprocess.run(["git", "-C", str(project), *args], check=True, capture_output=True)
    commit = subprocess.run(
        ["git", "-C", str(project), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return project, commit


KIT_IMAGE = f"{URI}:t1@sha256:{'d' * 64}"


def test_a_project_builds_on_the_kits_image_with_its_folder_as_the_context(image_app, fake_engine, tmp_path):
    project, commit = _project(tmp_path)
    result = CliRunner().invoke(image_app, ["image", "build", "--project", str(project), "--base", KIT_IMAGE])
    assert result.exit_code == 0, result.output
    (call,) = fake_engine()
    argv = call["argv"]
    assert argv[argv.index("--file") + 1] == str(build.USER_DOCKERFILE)
    assert argv[-1] == str(project)
    # Named after the folder, tagged with the project's own revision (not the kit's).
    assert argv[argv.index("--tag") + 1] == f"my-project:{commit}"
    passed = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")
    assert passed == {"KIT_IMAGE": KIT_IMAGE, "TRAINER_UID": str(IMAGE.trainer_uid)}
    assert result.stdout.split() == [f"my-project:{commit}"]


def test_the_project_recipe_keeps_the_kits_versions_user_and_package():
    text = build.USER_DOCKERFILE.read_text()
    # Every build arg the command passes is declared; the kit's installed versions constrain the
    # project's requirements; the image ends as the trainer's user, with the project on the path.
    assert set(build.user_build_args(kit_image=KIT_IMAGE)) <= set(
        re.findall(r"^ARG (\w+)", text, re.MULTILINE)
    )
    assert "pip list --format=freeze > /tmp/kit-constraints.txt" in text
    assert "-c /tmp/kit-constraints.txt -r /tmp/project-requirements.txt" in text
    assert re.findall(r"^USER (\S+)$", text, flags=re.MULTILINE)[-1] == "${TRAINER_UID}:${TRAINER_UID}"
    assert "ENV PYTHONPATH=/workspace" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base", KIT_IMAGE], "--base is the kit's image for a project's build: give --project DIR too"),
        (["--project", "{project}"], "--project needs --base"),
        (["--project", "{project}", "--base", URI], "it names no tag or digest"),
        (["--project", "{project}", "--base", f"{URI}@sha256:abc"], "the digest (sha256: and 64 hex digits)"),
        (
            ["--project", "{project}", "--base", KIT_IMAGE, "--name", "My_Image"],
            "--name 'My_Image' is not an",
        ),
        (["--project", "{project}/nowhere", "--base", KIT_IMAGE], "no such folder"),
        (["--project", "{bare}", "--base", KIT_IMAGE], "has no requirements.txt: add one"),
        (["--project", "{shadowing}", "--base", KIT_IMAGE], "would shadow the kit's own package (nvrx_eks)"),
    ],
)
def test_a_bad_project_build_is_one_message_and_runs_nothing(image_app, fake_engine, tmp_path, args, message):
    project, _ = _project(tmp_path / "ok")
    bare, _ = _project(tmp_path / "bare", requirements=False)
    shadowing, _ = _project(tmp_path / "shadowing")
    (shadowing / "nvrx_eks").mkdir()
    folders = {"project": project, "bare": bare, "shadowing": shadowing}
    result = CliRunner().invoke(image_app, ["image", "build", *(a.format(**folders) for a in args)])
    # A UserError is the CLI's one-line message and exit 2 (nvrx_eks.cli); a bad path is click's.
    refused = str(result.exception) if isinstance(result.exception, UserError) else result.output
    assert isinstance(result.exception, UserError) or result.exit_code == 2, result.output
    assert message in " ".join(refused.split()), refused
    assert fake_engine() == []


def test_push_without_the_store_pushes_a_projects_one_image(image_app, fake_engine):
    result = CliRunner().invoke(
        image_app,
        [
            "image",
            "push",
            "--repository",
            URI,
            "--name",
            "my-project",
            "--tag",
            "t5",
            "--no-store",
            "--dry-run",
        ],
    )
    assert result.exit_code == 0, result.output
    pushed = [shlex.split(line[2:]) for line in result.stderr.splitlines() if line.startswith("$ ")]
    assert [argv[1:] for argv in pushed if argv[1] in {"tag", "push"}] == [
        ["tag", "my-project:t5", f"{URI}:t5"],
        ["push", f"{URI}:t5"],
    ]
    assert result.stdout.split() == [f"{URI}:t5"]
