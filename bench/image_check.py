"""`make image-check`: build the shipped images here with podman and run them as the rendered pods do.

Nothing about the images is checked by reading files alone here: the store image is built from
images/store.Dockerfile and the training image from images/Dockerfile, then each runs as its pod of
the rendered local job would run it (the pod's user, read-only root filesystem, dropped capabilities,
the runtime's default seccomp filter, its mounts and environment), so a write outside the mounts, a
missing module or file, or an entrypoint that does not start as the pod's user fails here, not on a
GPU node. Then the demo's job runs under its fault plan with every pod a container of these images (the
local executor's podman runtime, localrun/runtimes.py): every fault must be recovered by its layer and
the final parameters must be bit-identical to the same job run fault-free as processes. Last, a training
project whose own package is named `training` (examples/own_package) is built on the training image as
`nvrx-eks image build --project` builds it, and runs as the job's entrypoint in containers of that image.
After the build, `--only containers` runs the one-container checks alone (they start no job, so they can
share the machine) and `--only jobs` the two jobs alone (their timeouts assume the machine's cores).

What differs from the shipped images, and why:
- No container registry is reachable from the machines this runs on, so the bases are made here: a
  Debian 12 root filesystem from Debian's archive (mmdebstrap, then `podman import`), then a Python
  virtual environment in it holding the CPU build of torch at kitcore/pins.py TORCH_VERSION and the
  locks' versions of everything else. Debian 12's Python is 3.11, the images' is 3.12: the versions are
  the locks', the wheels are cp311 ones (installed without the locks' hashes, which name cp312 wheels),
  and NVRx is this machine's Python-only rebuild of the published wheel (tools/nvrx-wheel.sh). The
  images' own lock steps then find every locked version installed, and check NVRx's.
- The training image is built with ACCELERATOR=cpu (its CUDA and EFA stages skipped) and the store's
  with TORCH_SOURCE=base (PyPI serves no CPU build of torch for Linux; its index is PyTorch's own).
  Every other instruction of both Dockerfiles runs as shipped. The output says which Python ran.

Podman on Debian 12 needs runc (its default, crun, refuses hybrid cgroups) and explicit rlimits (the
default ones cannot be set in a container here): every podman call below passes both.
Built images are tagged by the hash of their inputs, so a rerun with nothing changed builds nothing;
podman's layer cache makes a rerun after a trainer edit rebuild only the last layers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.images.build import (
    DOCKERFILE,
    LOCK_FILE,
    REPO_ROOT,
    STORE_DOCKERFILE,
    STORE_LOCK_FILE,
    TORCH_LOCK_FILE,
    USER_DOCKERFILE,
    build_args,
    locked_versions,
    store_build_args,
    user_build_args,
)
from nvrx_eks.k8s import DEFAULT_VALUES
from nvrx_eks.kitcore.pins import IMAGE, STORE_IMAGE, TORCH_VERSION
from nvrx_eks.localrun.runtimes import RUNC, ULIMITS

if TYPE_CHECKING:
    from collections.abc import Callable

STORE_UID = 65534
"""`nobody`, the store pod's user (images/store.Dockerfile, k8s/job_chart.py)."""

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
LOCAL_PREFIX = "localhost/nvrx-eks-local"
BUILD_DIR = REPO_ROOT / "build-images"
NVRX_WHEEL_DIR = REPO_ROOT / "build" / "wheels"
# Only in the training image's CUDA build: never installed in the CPU base.
CUDA_ONLY = re.compile(r"^(torch|triton|cuda-.*|nvidia-(?!resiliency-ext$|ml-py$).*)$")
PROBE = """
import importlib.metadata as m, json, os, platform, sys, torch
modules = sys.argv[1:]
for name in modules:
    __import__(name)
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "torch": torch.__version__,
    "python": platform.python_version(), "nvrx": m.version("nvidia-resiliency-ext"),
    "home": os.environ.get("HOME"), "imported": modules,
}))
"""


# This machine's CA bundle and a pip configuration naming it, mounted into every build step (never into
# a layer): where a TLS-inspecting proxy stands between the machine and PyPI, its CA is in that bundle,
# and pip (which trusts its own bundled certificates) needs to be told.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def build_volumes() -> list[str]:
    if not HOST_CA_BUNDLE.exists():
        return []
    BUILD_DIR.mkdir(exist_ok=True)
    pip_conf = BUILD_DIR / "pip.conf"
    pip_conf.write_text("[global]\ncert = /etc/ssl/host-ca.crt\n")
    return [
        "--volume",
        f"{HOST_CA_BUNDLE}:/etc/ssl/host-ca.crt:ro",
        "--volume",
        f"{pip_conf}:/etc/pip.conf:ro",
    ]


def podman(*args: str) -> list[str]:
    return ["podman", "--runtime", RUNC, *args]


def _run(argv: list[str], *, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
    print(f"$ {shlex.join(argv)}", file=sys.stderr, flush=True)
    done = subprocess.run(argv, text=True, capture_output=capture, check=False)
    if check and done.returncode:
        tail = (done.stderr or "")[-3000:] if capture else ""
        raise SystemExit(f"image-check: `{shlex.join(argv[:4])} ...` exited {done.returncode}\n{tail}")
    return done


def image_exists(name: str) -> bool:
    return subprocess.run(podman("image", "exists", name), check=False).returncode == 0


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
    return h.hexdigest()[:16]


def debian_base() -> str:
    """Debian 12 with Python 3.11 and its venv module, from Debian's archive, imported into podman."""
    packages = "python3,python3-venv,ca-certificates"
    name = f"{LOCAL_PREFIX}/debian:12-{_digest(DEBIAN_SUITE, packages)}"
    if image_exists(name):
        return name
    BUILD_DIR.mkdir(exist_ok=True)
    tarball = BUILD_DIR / f"debian12-{_digest(DEBIAN_SUITE, packages)}.tar"
    if not tarball.exists():
        partial = tarball.with_suffix(".partial.tar")
        _run(
            [
                "mmdebstrap",
                "--variant=minbase",
                f"--include={packages}",
                DEBIAN_SUITE,
                str(partial),
                DEBIAN_MIRROR,
            ]
        )
        partial.rename(tarball)
    _run(podman("import", "--change", "CMD /bin/bash", str(tarball), name))
    return name


def _local_version(name: str, fallback: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return fallback


def _wheelhouse(requirements: list[str]) -> dict[str, Path]:
    """Download (once) the cp311 wheels of `requirements` (name==version); name -> wheel file."""
    wheels = BUILD_DIR / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    listing = BUILD_DIR / "wheelhouse-requirements.txt"
    listing.write_text("\n".join(requirements) + "\n")
    _run([
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.11", "--implementation", "cp", "--platform", "manylinux_2_36_x86_64",
        *(arg for minor in range(35, 16, -1) for arg in ("--platform", f"manylinux_2_{minor}_x86_64")),
        "--platform", "manylinux2014_x86_64", "--platform", "linux_x86_64",
        "-d", str(wheels), "-r", str(listing),
    ])  # fmt: skip
    found: dict[str, Path] = {}
    wanted = dict(r.split("==") for r in requirements)
    for wheel in wheels.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        name = re.sub(r"[-_.]+", "-", name).lower()
        if wanted.get(name) == version:
            found[name] = wheel
    missing = sorted(wanted.keys() - found.keys())
    if missing:
        raise SystemExit(f"image-check: no cp311 wheel downloaded for {missing}")
    return found


def local_lock(kind: str, lock: Path) -> tuple[Path, dict[str, Path]]:
    """The image lock's packages (but the CUDA-only ones) at this environment's versions, with the hashes
    of their cp311 wheels: the lock the local build installs with `--require-hashes` in place of the
    image's (whose versions may need Python 3.12, and whose hashes name cp312 wheels)."""
    nvrx = NVRX_WHEEL_DIR / f"nvidia_resiliency_ext-{IMAGE.nvrx_version}-py3-none-any.whl"
    if not nvrx.exists():
        raise SystemExit(f"image-check: {nvrx} is missing: run `make setup` (tools/nvrx-wheel.sh makes it)")
    pinned = {
        name: _local_version(name, version)
        for name, version in locked_versions(lock.read_text()).items()
        if not CUDA_ONLY.match(name) and name != "nvidia-resiliency-ext"
    }
    wheels = _wheelhouse([f"{n}=={v}" for n, v in sorted(pinned.items())])
    wheels["nvidia-resiliency-ext"] = nvrx
    lines = [f"# {kind}: {lock.name} at this environment's versions, cp311 wheels (bench/image_check.py)"]
    for name, wheel in sorted(wheels.items()):
        version = IMAGE.nvrx_version if name == "nvidia-resiliency-ext" else pinned[name]
        lines.append(
            f"{name}=={version} \\\n    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}"
        )
    out = BUILD_DIR / "locks" / f"{kind}-requirements-cp311.lock"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out, wheels


def torch_wheel(out: Path) -> Path:
    """The CPU build of torch at the pin for this machine's Python, as `make setup` installs it."""
    out.mkdir(parents=True, exist_ok=True)
    found = sorted(out.glob(f"torch-{TORCH_VERSION}+cpu-cp311-*.whl"))
    if not found:
        _run([
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", str(out),
            f"torch=={TORCH_VERSION}+cpu",
        ])  # fmt: skip
        found = sorted(out.glob(f"torch-{TORCH_VERSION}+cpu-cp311-*.whl"))
    if not found:
        raise SystemExit(f"image-check: no CPU wheel of torch {TORCH_VERSION} for cp311 in {out}")
    return found[-1]


def python_base(kind: str, debian: str, wheels: list[Path]) -> str:
    """`debian` plus a venv (/opt/venv, first on PATH) holding the CPU torch and `wheels`."""
    context = BUILD_DIR / f"{kind}-base"
    shutil.rmtree(context, ignore_errors=True)
    (context / "torch").mkdir(parents=True)
    (context / "wheels").mkdir()
    torch = torch_wheel(BUILD_DIR / "wheels")
    (context / "torch" / torch.name).hardlink_to(torch)
    names = [torch.name]
    for wheel in wheels:
        (context / "wheels" / wheel.name).hardlink_to(wheel)
        names.append(wheel.name)
    # torch in a layer of its own, the same for both bases (podman's layer cache builds it once).
    containerfile = f"""FROM {debian}
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin VIRTUAL_ENV=/opt/venv
COPY torch/ /tmp/torch/
RUN python -m pip install --no-cache-dir --quiet --no-index --no-deps /tmp/torch/*.whl && rm -rf /tmp/torch
COPY wheels/ /tmp/wheels/
RUN python -m pip install --no-cache-dir --quiet --no-index --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels
"""
    (context / "Containerfile").write_text(containerfile)
    inputs = _digest(
        containerfile, *sorted(names), *(hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels)
    )
    name = f"{LOCAL_PREFIX}/{kind}-base:{inputs}"
    if not image_exists(name):
        containerfile_path = str(context / "Containerfile")
        _run(
            podman(
                "build", *ULIMITS, *build_volumes(), "--file", containerfile_path, "--tag", name, str(context)
            )
        )
    return name


@dataclass
class Built:
    name: str
    seconds: float
    size_bytes: int
    digest: str


def build_image(*, name: str, dockerfile: Path, args: dict[str, str], context: Path = REPO_ROOT) -> Built:
    # Docker's image format: the OCI one has no SHELL, and the Dockerfiles' `pipefail` must hold.
    argv = podman(
        "build", "--format", "docker", *ULIMITS, *build_volumes(), "--file", str(dockerfile), "--tag", name
    )
    for key, value in sorted(args.items()):
        argv += ["--build-arg", f"{key}={value}"]
    started = time.monotonic()
    _run([*argv, str(context)])
    seconds = time.monotonic() - started
    info = json.loads(_run(podman("image", "inspect", name), capture=True).stdout)[0]
    return Built(name=name, seconds=seconds, size_bytes=int(info["Size"]), digest=f"sha256:{info['Id']}")


def _on_local_base(args: dict[str, str], *, base: str, lock: Path) -> dict[str, str]:
    """An image's build args with its base and requirements lock the locally built ones. The local
    Debian 12 base: cp311 and glibc 2.36 stand in for the images' cp312 / glibc 2.39 (the runtime
    stage's check reads them)."""
    return {
        **args,
        "BASE_IMAGE": base,
        "REQUIREMENTS_LOCK": str(lock.relative_to(REPO_ROOT)),
        "PYTHON_ABI": "cp311",
    }


def build_all() -> tuple[Built, Built, float]:
    """The store and training images, and the seconds their local bases took (cached: ~0 on a rerun)."""
    bases_started = time.monotonic()
    debian = debian_base()
    store_lock, store_wheels = local_lock("store", STORE_LOCK_FILE)
    trainer_lock, _ = local_lock("trainer", LOCK_FILE)
    # The store's lock carries what torch imports; the trainer's gets it with torch (its torch lock).
    store_base = python_base("store", debian, [store_wheels["nvidia-resiliency-ext"]])
    _, torch_deps = local_lock("torch", TORCH_LOCK_FILE)
    trainer_base = python_base("trainer", debian, [*torch_deps.values()])
    bases_seconds = time.monotonic() - bases_started
    store = build_image(
        name=f"{LOCAL_PREFIX}/store:check",
        dockerfile=STORE_DOCKERFILE,
        args=_on_local_base(
            {**store_build_args(git_revision="image-check", pins=STORE_IMAGE), "TORCH_SOURCE": "base"},
            base=store_base,
            lock=store_lock,
        ),
    )
    trainer = build_image(
        name=f"{LOCAL_PREFIX}/training:check",
        dockerfile=DOCKERFILE,
        args=_on_local_base(
            {**build_args(git_revision="image-check", pins=IMAGE), "ACCELERATOR": "cpu", "MIN_GLIBC": "2.36"},
            base=trainer_base,
            lock=trainer_lock,
        ),
    )
    return store, trainer, bases_seconds


def render(*, trainer: Built, store: Built, out: Path) -> dict[str, dict[str, Any]]:
    """The local job's pod specs, rendered with the built images (by digest, as job values require)."""
    import yaml  # noqa: PLC0415

    values = DEFAULT_VALUES.read_text()
    values = re.sub(
        r"^image: local$",
        f"image: {trainer.name}@{trainer.digest}\nstore_image: {store.name}@{store.digest}",
        values,
        flags=re.MULTILINE,
    )
    (out / "values.yaml").write_text(values)
    cli = [sys.executable, "-m", "nvrx_eks", "job", "render", "-f", str(out / "values.yaml")]
    _run([*cli, "-o", str(out / "dist")], capture=True)
    docs = [d for f in sorted((out / "dist").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (store_deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return {"trainer": job["spec"]["template"], "store": store_deployment["spec"]["template"]}


def run_argv(
    image: str, template: dict[str, Any], container: str, *, volumes: Path, command: list[str] | None = None
) -> list[str]:
    """`podman run` of one container of a rendered pod, alone and without a network: its user,
    read-only root, capabilities, seccomp, environment and mounts (each volume a folder of its own under
    `volumes`, a Memory emptyDir a tmpfs). Downward-API values stand in as index 0's. `command` replaces
    the container's own (a probe); `$(VAR)` in the container's own expands from its environment."""
    spec = template["spec"]
    (c,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == container]
    security = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
    argv = podman("run", "--rm", *ULIMITS, "--network", "none")
    if "runAsUser" in security:
        argv += ["--user", f"{security['runAsUser']}:{security.get('runAsGroup', security['runAsUser'])}"]
    if security.get("readOnlyRootFilesystem"):
        # Podman adds tmpfs mounts at /tmp, /var/tmp and /run to a read-only container; Kubernetes does
        # not: a write there must fail here as it would in the pod.
        argv += ["--read-only", "--read-only-tmpfs=false"]
    for cap in security.get("capabilities", {}).get("drop", []):
        argv += ["--cap-drop", cap]
    if security.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    if security.get("seccompProfile", {}).get("type") not in (None, "RuntimeDefault"):
        raise SystemExit(f"image-check: {container}: seccomp {security['seccompProfile']} is not mapped")
    environment = {e["name"]: e.get("value", "0") for e in c.get("env", [])}
    for name, value in environment.items():
        argv += ["--env", f"{name}={value}"]
    by_name = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in c.get("volumeMounts", []):
        volume = by_name[mount["name"]]
        if volume.get("emptyDir", {}).get("medium") == "Memory":
            argv += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777"]
            continue
        folder = volumes / mount["name"]
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)  # the pod's own-dirs init container hands its folders to the pod's user
        argv += ["--volume", f"{folder}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}"]
    line = command if command is not None else [*c.get("command", []), *c.get("args", [])]
    expand = re.compile(r"\$\((\w+)\)")
    return [*argv, image, *(expand.sub(lambda m: environment.get(m[1], m[0]), arg) for arg in line)]


@dataclass
class Check:
    image: str
    name: str
    passed: bool
    detail: str


def _check(image: str, name: str, argv: list[str], *, expect: Callable[[str], bool] | None = None) -> Check:
    """Run `argv`: passed when it exits 0 and `expect` accepts its stdout."""
    done = _run(argv, capture=True, check=False)
    output = (done.stdout + done.stderr).strip()
    passed = done.returncode == 0
    if passed and expect is not None:
        passed = expect(done.stdout)
    return Check(
        image, name, passed, output[-1500:] if not passed else output.splitlines()[-1] if output else ""
    )


def _left_in_shm() -> set[str]:
    """What the pods' users (the trainer's, the store's) own in the machine's /dev/shm."""
    users = {IMAGE.trainer_uid, STORE_UID}
    shm = Path("/dev/shm")  # noqa: S108 - the machine's shared memory, inspected, not written
    return {p.name for p in shm.iterdir() if p.lstat().st_uid in users}


def chaos_in_containers(*, trainer: Built, store: Built, work: Path, timeout_s: float) -> Check:
    """The demo's job and fault plan with every pod a container (the executor's podman runtime), against
    the same job fault-free as processes (the demo's cached reference, run once if missing)."""
    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415
    from nvrx_eks.localrun.chaos import fault_free_sha256, run_job  # noqa: PLC0415
    from nvrx_eks.localrun.demo import DEMO_FAULTS, demo_values  # noqa: PLC0415
    from nvrx_eks.localrun.report import summary_document  # noqa: PLC0415
    from nvrx_eks.localrun.runtimes import Podman  # noqa: PLC0415
    from nvrx_eks.localrun.summary import summarize  # noqa: PLC0415

    console = make_console()
    values = demo_values(DEFAULT_VALUES)
    reference = fault_free_sha256(
        values, cache_dir=REPO_ROOT / "runs" / ".cache", run_dir=work / "fault-free", console=console
    )
    runtime = Podman(trainer_image=trainer.name, store_image=store.name)
    left_before = _left_in_shm()
    started = time.monotonic()
    label = "chaos in containers"
    outcome = run_job(
        values,
        run_dir=work / "containers",
        console=console,
        label=label,
        timeout_s=timeout_s,
        runtime=runtime,
    )
    seconds = time.monotonic() - started
    document = summary_document(summarize(outcome.trainer_run_dir), fault_free_sha256=reference)
    recovered = all(f["layer"] == f.get("expected_layer") for f in document["faults"])
    classes = {f["class"] for f in document["faults"]}
    expected = {item.split("@")[0] for item in DEMO_FAULTS}
    # A pod's /dev/shm dies with it: nothing its containers made may stay in the machine's.
    left = sorted(_left_in_shm() - left_before)
    passed = (
        outcome.job.succeeded and recovered and document["bit_identical"] and classes >= expected and not left
    )
    (work / "summary.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    verdict = "bit-identical" if document["bit_identical"] else "DIFFERENT"
    detail = (
        f"{seconds:.0f} s, job {outcome.job.reason}, {len(document['faults'])} faults "
        f"({'each recovered by its layer' if recovered else 'NOT each by its layer'}, classes "
        f"{sorted(classes)}), final params {str(document['final_params_sha256'])[:16]} vs fault-free "
        f"processes {str(reference)[:16]}: {verdict}"
    )
    if left:
        detail += f"\nleft in the machine's /dev/shm by the pods: {left[:5]} ({len(left)})"
    if not passed:
        detail += f"\npod logs: {work / 'containers' / 'pods'}"
    return Check("trainer", "demo fault plan in containers", passed, detail)


OWN_PACKAGE = REPO_ROOT / "examples" / "own_package"
"""A training project whose own package is named `training`, like the kit's trainer folder."""
OWN_PACKAGE_FAULTS = "exception@8:1,sigkill@16:2"


def build_project(*, trainer: Built, project: Path = OWN_PACKAGE) -> Built:
    """`project` on the training image, as `nvrx-eks image build --project` builds it: the same recipe
    (images/user.Dockerfile) and build arguments, the project folder as the context."""
    return build_image(
        name=f"{LOCAL_PREFIX}/own-package:check",
        dockerfile=USER_DOCKERFILE,
        args=user_build_args(kit_image=trainer.name),
        context=project,
    )


def project_in_containers(*, project: Built, store: Built, work: Path, timeout_s: float) -> Check:
    """The project's `training.loop` as the job's entrypoint, every pod a container of its image, with
    a fault for each in-pod layer: its modules, the forkserver's preload and every restarted worker
    must be the project's own `training`, next to the kit's `nvrx_eks.training`."""
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415
    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415
    from nvrx_eks.localrun.chaos import run_job  # noqa: PLC0415
    from nvrx_eks.localrun.runtimes import Podman  # noqa: PLC0415
    from nvrx_eks.localrun.summary import summarize  # noqa: PLC0415

    values = load_values(
        REPO_ROOT / "k8s/values/local-hf-llama.yaml",
        (
            "entrypoint.module=training.loop",
            "entrypoint.args=[--steps, '30']",
            "entrypoint.preload=[training.loop]",
            f"trainer.faults.plan={OWN_PACKAGE_FAULTS}",
        ),
    )
    started = time.monotonic()
    outcome = run_job(
        values,
        run_dir=work,
        console=make_console(),
        label="project image",
        timeout_s=timeout_s,
        runtime=Podman(trainer_image=project.name, store_image=store.name),
    )
    seconds = time.monotonic() - started
    faults = summarize(outcome.trainer_run_dir).faults if outcome.job.succeeded else []
    layers = [(f.cls, f.layer) for f in faults]
    passed = outcome.job.succeeded and layers == [("exception", "inprocess"), ("sigkill", "ft_launcher")]
    detail = f"{seconds:.0f} s, job {outcome.job.reason}, faults recovered by {layers}"
    if not passed:
        detail += f"\npod logs: {work / 'pods'}"
    return Check("project", "own `training` package in containers", passed, detail)


def check_images(
    *,
    trainer: Built,
    store: Built,
    work: Path,
    job_timeout_s: float = 600,
    project: Built | None = None,
    containers: bool = True,
    jobs: bool = True,
) -> tuple[list[Check], dict[str, Any]]:
    """`containers`: each image's probes, pip check, the store's command and the self-check, one
    container at a time; `jobs`: the demo's job and the project's in containers."""
    templates = render(trainer=trainer, store=store, out=work)
    checks: list[Check] = []
    probes: dict[str, Any] = {}
    if containers:
        checks += _container_checks(
            trainer=trainer, store=store, work=work, templates=templates, probes=probes
        )
    if not jobs:
        return checks, probes
    # The demo's job under its fault plan, every pod a container (the executor's podman runtime),
    # against the same job fault-free as processes: one torch, one trainer, so every fault recovered
    # by its layer and the final parameters bit-identical.
    checks.append(
        chaos_in_containers(trainer=trainer, store=store, work=work / "chaos", timeout_s=job_timeout_s)
    )
    if project is not None:
        checks.append(
            project_in_containers(
                project=project, store=store, work=work / "project", timeout_s=job_timeout_s
            )
        )
    return checks, probes


def _container_checks(
    *, trainer: Built, store: Built, work: Path, templates: dict[str, dict[str, Any]], probes: dict[str, Any]
) -> list[Check]:
    local_torch = _local_torch()
    checks: list[Check] = []

    def probe_ok(kind: str, uid: int) -> Callable[[str], bool]:
        def ok(stdout: str) -> bool:
            probe = json.loads(stdout.strip().splitlines()[-1])
            probes[kind] = probe
            return bool(
                probe["uid"] == uid and probe["torch"] == local_torch and probe["nvrx"] == IMAGE.nvrx_version
            )

        return ok

    store_modules = ["nvrx_eks.training.resilience.control", "torch.distributed"]
    trainer_modules = [
        "nvrx_eks.training",
        "nvrx_eks.training.resilience.launch",
        "nvrx_eks.training.node.selfcheck",
        "nvidia_resiliency_ext",
    ]
    for built, kind, container, uid, modules in (
        (store, "store", "store", STORE_UID, store_modules),
        (trainer, "trainer", "trainer", IMAGE.trainer_uid, trainer_modules),
    ):
        volumes = work / "volumes" / kind
        probe = run_argv(
            built.name, templates[kind], container, volumes=volumes, command=["python", "-c", PROBE, *modules]
        )
        checks.append(_check(kind, "imports, uid, torch", probe, expect=probe_ok(kind, uid)))
        pip_check = ["python", "-m", "pip", "check"]
        checks.append(
            _check(
                kind,
                "pip check",
                run_argv(built.name, templates[kind], container, volumes=volumes, command=pip_check),
            )
        )
    # The store pod's own command serves (still running after a few seconds, not exited).
    checks.append(
        _serves(run_argv(store.name, templates["store"], "store", volumes=work / "volumes" / "store"))
    )
    # The trainer pod's start-up self-check, as rendered, and its launcher's entrypoint.
    tv = work / "volumes" / "trainer"
    checks.append(
        _check(
            "trainer",
            "self-check (init container)",
            run_argv(trainer.name, templates["trainer"], "selfcheck", volumes=tv),
        )
    )
    return checks


def _serves(argv: list[str], *, settle_s: float = 8) -> Check:
    name = f"nvrx-eks-image-check-store-{int(time.time())}"
    # argv is `podman --runtime RUNC run --rm ...`: kept after it exits, so its logs can be read.
    if argv[3:5] != ["run", "--rm"]:
        raise ValueError(f"not a `podman run --rm` command line: {argv[:5]}")
    detached = [*argv[:4], "--detach", "--name", name, *argv[5:]]
    _run(detached, capture=True)
    time.sleep(settle_s)
    state = _run(
        podman("inspect", "--format", "{{.State.Running}}", name), capture=True, check=False
    ).stdout.strip()
    logs = _run(podman("logs", name), capture=True, check=False)
    _run(podman("rm", "--force", name), capture=True, check=False)
    output = (logs.stdout + logs.stderr).strip()
    return Check(
        "store",
        "store command serves",
        state == "true",
        output[-1500:] if state != "true" else f"running after {settle_s:.0f} s",
    )


def _local_torch() -> str:
    import torch  # noqa: PLC0415

    return torch.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=BUILD_DIR / "check", help="Run folder (rendered job, volumes, result)."
    )
    parser.add_argument(
        "--only",
        choices=("containers", "jobs"),
        help="Build the images, then run only the one-container checks (no job: they may share the "
        "machine) or only the jobs in containers (whose timeouts assume the machine's cores).",
    )
    options = parser.parse_args(argv)
    missing = [tool for tool in ("podman", "mmdebstrap") if not shutil.which(tool)] + (
        [] if Path(RUNC).exists() else [RUNC]
    )
    if missing:
        print(
            f"image-check: {', '.join(missing)} not found: apt-get install podman runc mmdebstrap",
            file=sys.stderr,
        )
        return 2
    return _check_all(options.out, time.monotonic(), only=options.only)


def _check_all(out: Path, started: float, *, only: str | None = None) -> int:
    store, trainer, bases_seconds = build_all()
    project = build_project(trainer=trainer)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    checks, probes = check_images(
        trainer=trainer,
        store=store,
        work=out,
        project=project,
        containers=only != "jobs",
        jobs=only != "containers",
    )
    total = time.monotonic() - started
    print()
    print(f"{'image':44} {'size':>10} {'build':>9}")
    for built in (store, trainer, project):
        print(f"{built.name:44} {built.size_bytes / 2**20:>7.0f} MiB {built.seconds:>7.1f} s")
    print(f"{'local bases (Debian 12, venv, CPU torch)':44} {'':>10} {bases_seconds:>7.1f} s")
    local_python = sys.version.split()[0]
    for kind, probe in probes.items():
        python, torch = probe["python"], probe["torch"]
        print(f"{kind}: python {python} (local {local_python}), torch {torch} (local {_local_torch()})")
    for check in checks:
        mark = "ok  " if check.passed else "FAIL"
        print(f"{mark} {check.image:8} {check.name}: {check.detail if check.passed else ''}")
        if not check.passed:
            print("     " + check.detail.replace("\n", "\n     "))
    passed = all(c.passed for c in checks)
    result = {
        "passed": passed,
        "seconds": round(total, 1),
        "bases_build_s": round(bases_seconds, 1),
        "images": {
            b.name: {"size_bytes": b.size_bytes, "build_s": round(b.seconds, 1), "id": b.digest}
            for b in (store, trainer, project)
        },
        "python": {"local": sys.version.split()[0], **{k: p["python"] for k, p in probes.items()}},
        "torch": {"local": _local_torch(), **{k: p["torch"] for k, p in probes.items()}},
        "checks": [c.__dict__ for c in checks],
    }
    (out / "image-check.json").write_text(json.dumps(result, indent=2) + "\n")
    verdict = "passed" if passed else "FAILED"
    print(f"image-check: {verdict} in {total:.0f} s ({out / 'image-check.json'})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
