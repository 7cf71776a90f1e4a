"""The job chart's launcher flags parse with the ft_launcher of the NVRx version the image pins.

The pinned wheel (cp312, manylinux_2_39) cannot install on this machine (Python 3.11, glibc 2.36), but
apart from the straggler extension it is pure Python: the test downloads it from PyPI once (cached
under .cache/, ignored by git), unpacks it, and imports its launcher in a subprocess with the unpacked
tree first on sys.path. The parse runs exactly what ft_launcher runs before starting workers:
`parse_args` and `FaultToleranceConfig.from_args`.

Modules the launcher imports only for services it starts later (gRPC log aggregation, an HTTP health
client, FastAPI) are replaced by inert stand-ins when this environment lacks them; the generated
protobuf bindings are replaced too because they need the real protobuf runtime. The argument parser
touches none of them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from k8s.launcher import FT_LAUNCHER
from kitcore.pins import IMAGE
from training.launch import launcher_argv, trainer_script

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "nvrx-wheels"
VALUES = REPO / "k8s" / "values" / "p5-2.yaml"

# Third-party modules imported by NVRx 0.7 at module level for its services (stubbed only if missing),
# and NVRx's generated gRPC/protobuf bindings (always stubbed: they need the protobuf runtime).
SERVICE_MODULES = ("httpx", "fastapi", "grpc", "grpc_tools", "slowapi", "uvicorn", "google.protobuf")
GENERATED = ("nvidia_resiliency_ext.shared_utils.proto",)

_PARSE = r"""
import importlib.abc, importlib.machinery, importlib.util, json, sys, types, warnings
tree, argvs = sys.argv[1], json.loads(sys.argv[4])
service, generated = sys.argv[2].split(","), sys.argv[3].split(",")
warnings.simplefilter("ignore")

def _missing(name):
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:
        return True

missing = [n for n in service if _missing(n)]
# A missing dotted module whose parent is missing too (google.protobuf without any google.*): stub both.
missing += [n.rsplit(".", 1)[0] for n in missing if "." in n and _missing(n.rsplit(".", 1)[0])]
stub_roots = tuple(missing + generated)

class _Inert:
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Inert()
    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _Inert):
            return args[0]  # used as a decorator
        return _Inert()
    def __mro_entries__(self, bases):
        return (object,)
    def __getitem__(self, key):
        return _Inert()
    def __iter__(self):
        return iter(())
    def __bool__(self):
        return False

class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name == "__version__":
            return "999.0.0"
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Inert()

class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if any(fullname == r or fullname.startswith(r + ".") for r in stub_roots):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None
    def create_module(self, spec):
        return _Module(spec.name)
    def exec_module(self, module):
        module.__path__ = []

sys.meta_path.insert(0, _Stubs())
sys.path.insert(0, tree)
from nvidia_resiliency_ext.fault_tolerance import launcher
from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
assert launcher.__file__.startswith(tree), launcher.__file__
def parse(argv):
    try:
        args = launcher.parse_args(argv)
        cfg = FaultToleranceConfig.from_args(args)
    except SystemExit as exc:
        return {"ok": False, "exit": exc.code}
    return {"ok": True, "nnodes": args.nnodes, "nproc": args.nproc_per_node, "module": args.module,
            "run_path": args.run_path, "start_method": args.start_method,
            "script": args.training_script, "rest": args.training_script_args,
            "rank_heartbeat_timeout": cfg.rank_heartbeat_timeout,
            "initial_rank_heartbeat_timeout": cfg.initial_rank_heartbeat_timeout,
            "restart_policy": args.ft_restart_policy}
print(json.dumps([parse(a) for a in argvs]))
"""


@pytest.fixture(scope="module")
def pinned_nvrx() -> Path:
    """The pinned NVRx wheel, unpacked (downloaded from PyPI on first use)."""
    version = IMAGE.nvrx_version
    tree = CACHE / f"nvidia_resiliency_ext-{version}"
    if (tree / "nvidia_resiliency_ext" / "fault_tolerance" / "launcher.py").is_file():
        return tree
    CACHE.mkdir(parents=True, exist_ok=True)
    abi = IMAGE.python_abi
    download = [
        sys.executable, "-m", "pip", "download", f"nvidia-resiliency-ext=={version}", "--no-deps",
        "--only-binary=:all:", "--python-version", f"{abi[2]}.{abi[3:]}", "--implementation", "cp",
        "--platform", f"manylinux_{IMAGE.min_glibc.replace('.', '_')}_x86_64", "-d", str(CACHE),
        "--disable-pip-version-check", "--quiet",
    ]  # fmt: skip
    done = subprocess.run(download, capture_output=True, text=True, timeout=180, check=False)
    if done.returncode:
        if any(s in done.stderr for s in ("NewConnectionError", "Network is unreachable", "Max retries")):
            pytest.skip(
                f"PyPI unreachable, cannot fetch nvidia-resiliency-ext=={version}: {done.stderr[-300:]}"
            )
        pytest.fail(f"pip download of the pinned NVRx failed:\n{done.stderr}")
    [wheel] = CACHE.glob(f"nvidia_resiliency_ext-{version}-*.whl")
    partial = tree.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(partial)
    partial.rename(tree)
    return tree


def _parse(tree: Path, argvs: list[list[str]]) -> list[dict]:
    """Parse each argv with the pinned launcher (one interpreter: torch is imported once)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PARSE,
            str(tree),
            ",".join(SERVICE_MODULES),
            ",".join(GENERATED),
            json.dumps(argvs),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tree,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _chart_command(mode: str) -> list[str]:
    from k8s.job_chart import node_address, store_endpoint  # noqa: PLC0415
    from k8s.launcher import launcher_command  # noqa: PLC0415
    from k8s.load import load_values  # noqa: PLC0415
    from k8s.trainer_args import trainer_args  # noqa: PLC0415

    values = load_values(VALUES, [f"mode={mode}"])
    assert values.resolved_nvrx_version == IMAGE.nvrx_version  # an image job: flags from the pin
    return launcher_command(
        values,
        store_endpoint=store_endpoint(values),
        node_address=node_address(values),
        trainer_args=trainer_args(values),
    )


MODES = ("both", "ft_launcher", "inprocess")
# 0.4.1-only spellings (shared README section 6): each must be refused, proving the parse can fail.
REMOVED_IN_PIN = (["--ignore-missing-fault-tol-cfg"], ["--ft-restart-policy=min-healthy"])


@pytest.fixture(scope="module")
def parsed(pinned_nvrx) -> dict[str, tuple[list[str], dict]]:
    commands = {mode: _chart_command(mode) for mode in MODES}
    base = commands["ft_launcher"]
    at = base.index("training") - 1  # the trainer's `-m training`
    for extra in REMOVED_IN_PIN:
        commands[" ".join(extra)] = [*base[:at], *extra, *base[at:]]
    # What ft_launcher receives: training/launch.py's rewrite of the rendered command's arguments.
    argvs = [launcher_argv(command[len(FT_LAUNCHER) :]) for command in commands.values()]
    results = _parse(pinned_nvrx, argvs)
    return {key: (command, result) for (key, command), result in zip(commands.items(), results, strict=True)}


@pytest.mark.parametrize("mode", MODES)
def test_chart_launcher_flags_parse_with_the_pinned_ft_launcher(parsed, mode):
    command, result = parsed[mode]
    assert command[: len(FT_LAUNCHER)] == list(FT_LAUNCHER)
    assert result["ok"], f"NVRx {IMAGE.nvrx_version} ft_launcher rejected: {command}"
    # The workers fork from the warm forkserver and run the trainer's __main__ (training/launch.py).
    assert result["module"] is False
    assert result["run_path"] is True
    assert result["start_method"] == "forkserver"
    assert result["script"] == trainer_script()
    assert result["nnodes"] == "2:2"
    assert result["nproc"] == "8"
    assert result["rank_heartbeat_timeout"] == 300
    assert result["initial_rank_heartbeat_timeout"] == 1200
    assert result["restart_policy"] == "any-failed"
    # The trainer's own arguments arrive untouched after `-m training`.
    assert result["rest"] == command[command.index("training") + 1 :]


@pytest.mark.parametrize("extra", REMOVED_IN_PIN, ids=lambda e: e[0])
def test_the_pinned_parser_really_rejects_flags_it_lacks(parsed, extra):
    assert parsed[" ".join(extra)][1] == {"ok": False, "exit": 2}
