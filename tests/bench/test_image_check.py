"""`make image-check`: the shipped images, built here with podman and run as the rendered pods do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nvrx_eks.bench import image_check
from nvrx_eks.bench.image_check import Built
from nvrx_eks.kitcore.pins import TRAINER_UID

TRAINER = Built(
    name="localhost/nvrx-eks-local/training:check", seconds=0, size_bytes=0, digest="sha256:" + "a" * 64
)
STORE = Built(
    name="localhost/nvrx-eks-local/store:check", seconds=0, size_bytes=0, digest="sha256:" + "b" * 64
)


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return image_check.render(trainer=TRAINER, store=STORE, out=tmp_path_factory.mktemp("render"))


def test_the_trainer_container_runs_as_its_rendered_pod(templates, tmp_path):
    argv = image_check.run_argv(TRAINER.name, templates["trainer"], "trainer", volumes=tmp_path)
    assert argv[:3] == ["podman", "--runtime", image_check.RUNC]
    assert _pairs(argv, "--user") == [f"{TRAINER_UID}:{TRAINER_UID}"]
    # Read-only root without podman's own tmpfs at /tmp: only the pod's mounts are writable.
    assert "--read-only" in argv
    assert "--read-only-tmpfs=false" in argv
    assert _pairs(argv, "--cap-drop") == ["ALL"]
    assert _pairs(argv, "--security-opt") == ["no-new-privileges"]
    assert "HOME=/tmp" in _pairs(argv, "--env")
    mounts = {spec.split(":")[1]: spec for spec in _pairs(argv, "--volume")}
    # The scratch emptyDir at /tmp, the checkpoint tiers and the FSx claim are folders; shared memory
    # and the memory tier are tmpfs, as their Memory emptyDirs are.
    assert {"/tmp", "/fsx", "/local"} <= mounts.keys()
    assert {spec.split(":")[0] for spec in _pairs(argv, "--tmpfs")} == {"/dev/shm", "/checkpoint-memory"}
    # The rendered command, not the image's default: the launcher.
    image_at = argv.index(TRAINER.name)
    assert argv[image_at + 1 : image_at + 4] == ["python", "-m", "nvrx_eks.training.resilience.launch"]


def test_the_store_container_runs_as_nobody_with_its_tmp(templates, tmp_path):
    argv = image_check.run_argv(STORE.name, templates["store"], "store", volumes=tmp_path)
    assert _pairs(argv, "--user") == ["65534:65534"]
    assert "--read-only" in argv
    assert [spec.split(":")[1] for spec in _pairs(argv, "--volume")] == ["/tmp"]
    assert argv[argv.index(STORE.name) + 1 : argv.index(STORE.name) + 4] == [
        "python",
        "-m",
        "nvrx_eks.training.resilience.control",
    ]


def _podman_missing() -> str | None:
    missing = [t for t in ("podman", "mmdebstrap") if not shutil.which(t)]
    missing += [] if Path(image_check.RUNC).exists() else [image_check.RUNC]
    return f"{', '.join(missing)} not installed (apt-get install podman runc mmdebstrap)" if missing else None


def _image_check(out: Path, only: str) -> dict:
    code = image_check.main(["--out", str(out), "--only", only])
    result = json.loads((out / "image-check.json").read_text())
    failed = [c for c in result["checks"] if not c["passed"]]
    assert code == 0, failed
    assert not failed
    for image in result["images"].values():
        assert image["size_bytes"] > 0
    return result


# Building the images and running one container at a time starts no job: `make test` runs this beside
# the fast tests, and the jobs below (one at a time) then find every image built.
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.shareable
@pytest.mark.timeout(1200)  # from a clean machine: the bases and the three images
@pytest.mark.skipif(_podman_missing() is not None, reason=str(_podman_missing()))
def test_image_check_builds_both_images_and_each_runs_as_its_pod(tmp_path):
    result = _image_check(tmp_path, "containers")
    # One torch release: the venv's and each image's.
    assert result["torch"]["store"] == result["torch"]["trainer"] == result["torch"]["local"]
    names = {(c["image"], c["name"]) for c in result["checks"]}
    assert names == {
        *((kind, check) for kind in ("store", "trainer") for check in ("imports, uid, torch", "pip check")),
        ("store", "store command serves"),
        ("trainer", "self-check (init container)"),
    }


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(1200)  # from a clean machine: the bases, the images, the job twice
@pytest.mark.skipif(_podman_missing() is not None, reason=str(_podman_missing()))
def test_image_check_runs_the_demo_and_a_project_with_every_pod_a_container(tmp_path):
    result = _image_check(tmp_path, "jobs")
    # The demo's faults in containers, bit-identical.
    (chaos,) = [c for c in result["checks"] if c["name"] == "demo fault plan in containers"]
    assert "each recovered by its layer" in chaos["detail"]
    assert chaos["detail"].endswith("bit-identical")
    # A project whose own package is named `training`, built as `image build --project` builds it, runs
    # as the job's entrypoint beside the kit's nvrx_eks.training, its faults recovered by their layers.
    (project,) = [c for c in result["checks"] if c["image"] == "project"]
    assert "('exception', 'inprocess'), ('sigkill', 'ft_launcher')" in project["detail"]
    assert len(result["checks"]) == 2
