"""The images' tag is a hash of what their Dockerfiles take from the checkout (infra/revision.py): the
same for every checkout with the same image inputs, new when one of them changes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from nvrx_eks.infra.revision import IMAGE_RECIPES, image_inputs, image_revision

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the image inputs and of files beside them that are not inputs."""
    for path in [
        *image_inputs(REPO),
        REPO / "README.md",
        REPO / "infra" / "config.py",
        REPO / "docs" / "aws.md",
        REPO / "infra" / "cluster_pins.py",
    ]:
        target = tmp_path / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return tmp_path


def test_the_inputs_are_what_the_dockerfiles_copy_and_mount():
    relative = {p.relative_to(REPO).as_posix() for p in image_inputs(REPO)}
    assert set(IMAGE_RECIPES) <= relative
    # COPY sources (an ARG's default for ${REQUIREMENTS_LOCK}), folders expanded, bind mounts.
    assert {
        "images/requirements.lock",
        "images/store-requirements.lock",
        "images/torch-requirements.lock",
    } <= relative
    assert {
        "training/api.py",
        "training/resilience/nvrx_compat.py",
        "kitcore/pins.py",
        "pyproject.toml",
    } <= relative
    assert {"images/trainer_requires.py", "images/check_base.py"} <= relative
    assert not any("__pycache__" in p for p in relative)
    # What the image does not hold: the README, the charts and stacks, the docs.
    assert not any(p.startswith(("k8s/", "infra/", "docs/", "tests/")) or p == "README.md" for p in relative)


def test_the_tag_follows_the_image_inputs_and_nothing_else(checkout):
    tag = image_revision(checkout)
    assert tag == image_revision(REPO)
    assert tag.startswith("img-")
    assert len(tag) == len("img-") + 12
    for not_an_input in ("README.md", "infra/config.py", "docs/aws.md", "infra/cluster_pins.py"):
        (checkout / not_an_input).write_text("edited\n")
    (checkout / "training" / "__pycache__").mkdir(exist_ok=True)
    (checkout / "training" / "__pycache__" / "api.cpython-311.pyc").write_bytes(b"\0")
    assert image_revision(checkout) == tag
    for an_input in ("training/api.py", "images/requirements.lock", "images/Dockerfile", "kitcore/pins.py"):
        before = image_revision(checkout)
        path = checkout / an_input
        path.write_text(path.read_text() + "\n# changed\n")
        assert image_revision(checkout) != before, an_input
    (checkout / "training" / "new_module.py").write_text("")
    assert image_revision(checkout) != before


def test_a_source_the_dockerfiles_name_but_the_checkout_lacks_is_named(checkout):
    (checkout / "images" / "check_base.py").unlink()
    with pytest.raises(FileNotFoundError, match=r"images/check_base.py: named by images/Dockerfile"):
        image_revision(checkout)


def test_pyproject_counts_as_the_trainer_wheel_holds_it(checkout):
    """The image holds pyproject.toml as images/trainer_requires.py cuts it: a development tool or a
    cluster-side dependency added to it names the same images, a trainer dependency's range does not."""
    pyproject = checkout / "pyproject.toml"
    text = pyproject.read_text()
    tag = image_revision(checkout)
    tool = text.replace('  "mypy>=', '  "a-new-dev-tool>=1",\n  "mypy>=', 1)
    tool = tool.replace('  "typer>=', '  "a-cluster-library>=1",   # a comment\n  "typer>=', 1)
    tool = tool.replace("[tool.ruff]\n", "[tool.ruff]\n# a ruff setting\n", 1)
    assert tool.count("\n") == text.count("\n") + 3
    pyproject.write_text(tool)
    assert image_revision(checkout) == tag
    trainer = re.sub(r'"pydantic>=[^"]*"', '"pydantic>=2.99,<3"', text, count=1)
    assert trainer != text
    pyproject.write_text(trainer)
    assert image_revision(checkout) != tag


def test_the_cluster_pins_are_not_an_image_input():
    """Chart, add-on and Kubernetes pins live outside what the images copy (kitcore/ is copied whole):
    a bump there must not re-tag the node check onto an image nobody pushed."""
    relative = {p.relative_to(REPO).as_posix() for p in image_inputs(REPO)}
    assert "infra/cluster_pins.py" not in relative
    from nvrx_eks.kitcore import pins  # noqa: PLC0415

    cluster_names = {"HELM_CHARTS", "EKS_ADDONS", "SUPPORTED_KUBERNETES_VERSIONS", "KUBECTL_LAYER_MINOR"}
    assert not cluster_names & set(vars(pins)), "cluster-side pins in kitcore/pins.py, which the images copy"
