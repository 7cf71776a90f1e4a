"""The rendezvous store's image (images/store.Dockerfile): its pins, its contents, the job that runs it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from nvrx_eks.images.build import (
    BASE_PARTS,
    STORE_BUILD_ARG_NAMES,
    STORE_DOCKERFILE,
    STORE_LOCK_FILE,
    STORE_PROVIDED,
    locked_versions,
    store_build_args,
)
from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.load import load_values
from nvrx_eks.k8s.names import STORE_PORT
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.pins import IMAGE, STORE_IMAGE

ROOT = Path(__file__).resolve().parents[2]
TEXT = STORE_DOCKERFILE.read_text()
P5 = ROOT / "k8s" / "values" / "p5-2.yaml"
LOCAL = ROOT / "k8s" / "values" / "local-cpu.yaml"
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def _arg_defaults() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)\s*$", TEXT, flags=re.MULTILINE))


def test_hadolint_reports_nothing():
    hadolint = shutil.which("hadolint") or str(ROOT / ".venv/bin/hadolint")
    done = subprocess.run(
        [hadolint, "--format", "json", str(STORE_DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert json.loads(done.stdout or "[]") == [], done.stdout
    assert done.returncode == 0


def test_arg_defaults_equal_the_store_pins_and_the_build_passes_every_pin():
    args = store_build_args(git_revision="abc123")
    assert {f.name for f in fields(STORE_IMAGE)} - BASE_PARTS | {"base_image"} == STORE_BUILD_ARG_NAMES.keys()
    defaults = _arg_defaults()
    for name, arg in STORE_BUILD_ARG_NAMES.items():
        assert defaults[arg] == args[arg] == str(getattr(STORE_IMAGE, name)), arg
    declared = set(re.findall(r"^ARG (\w+)", TEXT, flags=re.MULTILINE))
    assert declared - args.keys() == {"SOURCE_URL", "TORCH_SOURCE", "REQUIREMENTS_LOCK"}
    assert _arg_defaults()["REQUIREMENTS_LOCK"] == "images/store-requirements.lock"
    # TORCH_SOURCE is the build's variant, not a pin: its default is the shipped image's checked wheel
    # (the local image check alone passes base).
    assert _arg_defaults()["TORCH_SOURCE"] == "wheel"
    # One NVRx for both images, the base by digest, torch's wheel from the URL the pins name.
    assert STORE_IMAGE.nvrx_version == IMAGE.nvrx_version
    assert DIGEST.search(STORE_IMAGE.base_image)
    templated = STORE_IMAGE.torch_wheel_url.replace(STORE_IMAGE.torch_version, "${TORCH_VERSION}")
    templated = templated.replace(STORE_IMAGE.python_abi, "${PYTHON_ABI}")
    assert f'"{templated}"' in TEXT
    assert '"${TORCH_SHA256}"' in TEXT
    assert "source=images/fetch-verified.sh" in TEXT


def test_the_lock_has_nvrx_at_the_pin_with_hashes_and_leaves_torch_to_its_verified_wheel():
    text = STORE_LOCK_FILE.read_text()
    versions = locked_versions(text)
    assert versions["nvidia-resiliency-ext"] == STORE_IMAGE.nvrx_version
    assert not any(STORE_PROVIDED.match(name) for name in versions)
    # What torch imports at start-up is in (the CPU wheel is installed with --no-deps).
    assert {"filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec"} <= versions.keys()
    # No CUDA library: the store has no GPU.
    assert not [
        n for n in versions if n.startswith("nvidia-") and n not in {"nvidia-resiliency-ext", "nvidia-ml-py"}
    ]
    assert text.count("--hash=sha256:") == len(versions)
    assert "--require-hashes --no-deps -r /tmp/requirements.lock" in TEXT


def test_the_image_holds_exactly_what_the_store_command_imports_from_this_project(tmp_path):
    """The files the Dockerfile copies, alone on sys.path, run the imports of `python -m
    nvrx_eks.training.resilience.control`: each at its repository path, mapped by pyproject.toml's
    package-dir as in any checkout, and nothing else of the checkout importable."""
    copied = []  # where each copied file lands under WORKDIR /app
    for line in TEXT.splitlines():
        if line.startswith("COPY ") and "--from" not in line and "requirements" not in line:
            *sources, dest = line.split()[1:]
            for source in sources:
                target = tmp_path / dest / Path(source).name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, target)
                if target.suffix == ".py":
                    copied.append(str(target.relative_to(tmp_path)))
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        # Only the copied files: this environment's editable install would find the rest of the kit.
        "sys.meta_path = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')];"
        "import nvrx_eks.training.resilience.control;"
        "import nvrx_eks.training.resilience.nvrx_compat;"
        "mods = [m for n, m in sys.modules.items() if n.split('.')[0] == 'nvrx_eks'];"
        "print('\\n'.join(sorted(m.__file__ for m in mods)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert loaded, "nothing of the project was imported"
    assert all(Path(f).is_relative_to(tmp_path) for f in loaded), loaded
    assert sorted(str(Path(f).relative_to(tmp_path)) for f in loaded) == sorted(copied)


def test_the_store_runs_as_nobody_like_its_pod():
    assert re.findall(r"^USER (\S+)$", TEXT, flags=re.MULTILINE) == ["65534:65534"]


@pytest.mark.parametrize("values_file", sorted(P5.parent.glob("p5-*.yaml")), ids=lambda p: p.stem)
def test_the_rendered_store_runs_the_store_image_and_the_trainers_the_training_image(values_file, tmp_path):
    values = load_values(values_file)
    docs = [d for f in render(values, str(tmp_path)) for d in yaml.safe_load_all(Path(f).read_text()) if d]
    (store,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = store["spec"]["template"]["spec"]["containers"]
    assert container["image"] == values.store_image != values.image
    assert DIGEST.search(container["image"])
    assert container["command"][:3] == ["python", "-m", "nvrx_eks.training.resilience.control"]
    assert container["securityContext"]["runAsUser"] == 65534
    assert any(p["containerPort"] == STORE_PORT for p in container["ports"])
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {values.image}


@pytest.mark.parametrize(
    ("values_file", "overrides", "message"),
    [
        (P5, ["store_image=null"], "store_image is missing: the rendezvous store runs its own small image"),
        (P5, ["store_image=local"], "store_image is missing"),
        (P5, ["store_image=repo/store:v1"], "store_image: 'repo/store:v1' has no digest"),
        (LOCAL, [f"store_image=r/s:t@sha256:{'a' * 64}"], "store_image: image: local runs the whole job"),
    ],
)
def test_a_missing_or_unpinned_store_image_is_one_message(values_file, overrides, message):
    with pytest.raises(UserError) as info:
        load_values(values_file, overrides)
    assert message in str(info.value)


def test_the_local_store_runs_here_with_the_job(tmp_path):
    docs = [
        d
        for f in render(load_values(LOCAL), str(tmp_path))
        for d in yaml.safe_load_all(Path(f).read_text())
        if d
    ]
    (store,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = store["spec"]["template"]["spec"]["containers"]
    assert (container["image"], container["imagePullPolicy"]) == ("local", "Never")
