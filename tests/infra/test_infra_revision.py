"""The images' tag is a hash of what their Dockerfiles take from the checkout (infra/revision.py): the
same for every checkout with the same image inputs, new when one of them changes."""

from __future__ import annotations

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
    for not_an_input in ("README.md", "infra/config.py", "docs/aws.md"):
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
