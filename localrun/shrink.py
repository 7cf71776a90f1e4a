"""`nvrx-eks local shrink`: a node lost with no spare and no capacity; the job shrinks, trains on, grows
back when the replacement is scheduled, and finishes; then the verdict.

1. The local values with the job values' `shrink` on (`SHRINK_OVERRIDES`: down to 1 node once a lost
   node's replacement has stayed away 3 s) and a node loss planned on node 1.
2. The local executor holds the lost node's replacement pod Pending for `hold_s` ("no capacity"), then
   schedules it.
3. The run's events give its generations: the processes of one world, the step they restored and the
   steps they trained (`generations`).
4. The verdict: every step trained exactly once after each restored step (`lineage_problems`), and the
   final parameters equal those of a reference that follows the same size changes at the same steps:
   the same script under plain torchrun (localrun/torchrun.py), fault-free, one segment per generation
   at the generation's ranks, each resumed from the checkpoint the segment before left at the step the
   chaos run restored (`reference_sha256`). Bit-identical where the layout allows it, else the measured
   difference.
5. The phases: node lost -> shrink decision (the control process's line) -> first step on fewer nodes;
   replacement scheduled -> grow decision -> first step at the full size.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nvrx_eks.localrun.torchrun import standalone
from nvrx_eks.training.events import read_events

if TYPE_CHECKING:
    from pathlib import Path

    from nvrx_eks.k8s.values import JobValues

SHRINK_OVERRIDES = (
    "shrink.min_nodes=1",
    "shrink.pending_limit_s=3",
    # Long enough that the shrunk job still trains when the replacement joins, on a loaded machine too:
    # it is scheduled HOLD_S after the loss, and its pod's start and its launcher's first beats slow
    # down with the machine's load; the shrunk job trains a step in two emulated device steps.
    'entrypoint.args=["--model","tiny","--steps","200","--emulated-device-step-s","0.1"]',
    # Rank 2 lives on node 1: the node that does not host rank 0 is the one lost.
    'trainer.faults.plan=["node_loss@40:2"]',
)
HOLD_S = 10.0
"""How long the lost node's replacement stays Pending (no capacity) before it is scheduled."""
_CONTROL_LINE = re.compile(r"(closing with (?P<size>\d+) of \d+ nodes|can grow back).* at (?P<t>\d+\.\d+)")


@dataclass
class Generation:
    """The processes of one world: its size, the step it restored (-1: a fresh start), what it trained."""

    world_size: int
    full_world_size: int
    restored: int
    steps: dict[int, list[int]] = field(default_factory=dict)
    """Rank -> the steps it finished, in order."""
    started: float = 0.0
    first_step_t: float | None = None


def generations(events: list[dict[str, Any]]) -> list[Generation]:
    """The run's generations in order: a new one begins with every `attempt_start` whose process is new
    at another world size or after a restore; each process's events go to its generation."""
    by_pid: dict[int, Generation] = {}
    out: list[Generation] = []
    for event in events:
        kind, pid = event["kind"], int(event.get("pid", -1))
        if kind == "attempt_start" and pid not in by_pid:
            current = out[-1] if out else None
            if (
                current is None
                or current.world_size != event["world_size"]
                or len(current.steps) >= current.world_size
            ):
                current = Generation(
                    world_size=int(event["world_size"]),
                    full_world_size=int(event["full_world_size"]),
                    restored=-1,
                    started=float(event["t"]),
                )
                out.append(current)
            by_pid[pid] = current
            current.steps.setdefault(int(event["rank"]), [])
        elif kind == "checkpoint_restored" and pid in by_pid:
            by_pid[pid].restored = int(event["step"])
        elif kind == "step" and pid in by_pid:
            generation = by_pid[pid]
            generation.steps.setdefault(int(event["rank"]), []).append(int(event["step"]))
            if generation.first_step_t is None:
                generation.first_step_t = float(event["t"])
    return out


def lineage_problems(gens: list[Generation], steps: int) -> list[str]:
    """What breaks "every step trained exactly once after each restored step": within a generation,
    every rank trains the same steps (a stopped generation's ranks may name one last step fewer), from
    its restored step + 1, with no gap or repeat; each next generation restores a step its predecessor
    trained (or restored); the last ends at `steps - 1`."""
    problems: list[str] = []
    for index, gen in enumerate(gens):
        by_length = sorted(gen.steps.values(), key=len) or [[]]
        seq = by_length[-1]
        # A generation that a later one follows was stopped by its launchers, whose signal reaches each
        # rank at its own moment: a rank stopped after a step's all-reduce but before its `step` event
        # names one step fewer than the others. Any other difference is a broken lineage.
        spread = len(seq) - len(by_length[0])
        if (
            len(gen.steps) != gen.world_size
            or any(steps != seq[: len(steps)] for steps in by_length)
            or spread > (1 if index + 1 < len(gens) else 0)
        ):
            problems.append(f"generation {index}: its {gen.world_size} ranks trained different steps")
            continue
        if list(seq) != list(range(gen.restored + 1, gen.restored + 1 + len(seq))):
            problems.append(
                f"generation {index}: steps {seq[:3]}... do not follow restored step {gen.restored}"
            )
        if index + 1 < len(gens):
            after = gens[index + 1].restored
            if not gen.restored <= after <= (seq[-1] if seq else gen.restored):
                problems.append(
                    f"generation {index + 1} restored step {after}, which generation {index} never had"
                )
        elif not seq or seq[-1] != steps - 1:
            problems.append(f"the last generation ended at step {seq[-1] if seq else None}, not {steps - 1}")
    return problems


def control_decisions(store_log: Path) -> tuple[list[float], list[float]]:
    """(shrink decision times, grow decision times) from the control process's log lines."""
    shrinks: list[float] = []
    grows: list[float] = []
    for line in store_log.read_text(errors="replace").splitlines():
        found = _CONTROL_LINE.search(line)
        if found is not None:
            (shrinks if found["size"] else grows).append(float(found["t"]))
    return shrinks, grows


def _torchrun_segment(*, ranks: int, argv: list[str], config: dict[str, Any], timeout_s: float) -> None:
    """One reference segment: `ranks` ranks under one plain torchrun agent (`--standalone`), fault-free.
    Its `shrink.nodes` makes `attempt.full_world_size` the job's at its full size whatever the agent's
    ranks, so each rank reads the same share of each global batch as in the job."""
    full = int(config["shrink"]["nodes"]) * int(config["ranks_per_node"])
    segment = {k: v for k, v in config.items() if k != "ranks_per_node"}
    segment["shrink"] = {**config["shrink"], "nodes": full // ranks, "node_counts": [1]}
    env = {**os.environ, "NVRX_EKS_CONFIG": json.dumps(segment), "OMP_NUM_THREADS": "1"}
    env.pop("NVRX_EKS_RENDEZVOUS", None)
    done = subprocess.run(
        standalone(ranks=ranks, entry=argv),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the reference segment on {ranks} ranks failed:\n{(done.stdout + done.stderr)[-3000:]}"
        )


def reference_sha256(
    values: JobValues, gens: list[Generation], *, run_dir: Path, timeout_s: float = 300.0
) -> tuple[str, Path]:
    """The final-parameter hash (and the kept final state) of the script run fault-free under plain
    torchrun through the chaos run's size changes: segment i trains on generation i's nodes up to the
    step generation i + 1 restored, and resumes from the durable checkpoint segment i - 1 left there."""
    from nvrx_eks.training.attempt import FINAL_STATE  # noqa: PLC0415

    per_node = values.profile.workers_per_node
    entry = values.entrypoint
    script = ["-m", entry.module] if entry.module else [str(entry.script)]
    args = list(entry.args)
    steps = int(args[args.index("--steps") + 1])
    ends = [gen.restored for gen in gens[1:]] + [steps - 1]
    config = values.trainer.model_dump(mode="json")
    config |= {"mode": "baseline", "run_dir": str(run_dir), "faults": {}}
    config["checkpoint"] |= {
        # Each segment's last step on disk when its process ends, whatever the machine's load: the
        # synchronous checkpointer, due at the segment's end (below). (The tiered one skips a due step
        # while its writer is still busy, and the next segment would resume from an older one.)
        "implementation": "sync",
        "memory_dir": str(run_dir / "shm"),
        "local_dir": None,
        "durable_dir": str(run_dir / "checkpoints"),
        "peer_replicas": 0,
        "fsync": False,
    }
    if "--emulated-device-step-s" in args:  # only a wait: the reference computes the same without it
        args[args.index("--emulated-device-step-s") + 1] = "0"
    for i, (gen, end) in enumerate(zip(gens, ends, strict=True)):
        segment_args = [*args]
        segment_args[segment_args.index("--steps") + 1] = str(end + 1)
        # A step is due when the cadence divides it: the segment's end is its one due step after its
        # first (the last segment's none: its final state is kept anyway), not every step a cadence
        # common to all the ends would write.
        every = end if end > 0 and i < len(ends) - 1 else steps
        _torchrun_segment(
            ranks=gen.world_size,
            argv=[*script, *segment_args],
            config={
                **config,
                "checkpoint": {**config["checkpoint"], "durable_every": every},
                "ranks_per_node": per_node,
            },
            timeout_s=timeout_s,
        )
    resumed = [
        int(e["restored_step"])
        for e in read_events(run_dir)
        if e["kind"] == "startup_done" and e["rank"] == 0
    ]
    if resumed != [-1, *ends[:-1]]:
        raise RuntimeError(
            f"the reference's segments resumed from steps {resumed}, not the chaos run's {[-1, *ends[:-1]]}"
        )
    final = json.loads((run_dir / "final.json").read_text())
    return str(final["final_params_sha256"]), run_dir / FINAL_STATE


@dataclass
class ShrinkReport:
    generations: list[Generation]
    problems: list[str]
    """What breaks the exactly-once lineage (empty: none)."""
    chaos_sha256: str
    reference_sha256: str
    difference: dict[str, Any] | None
    """The measured difference when the hashes differ (localrun/numerics.py `compare`)."""
    phases: dict[str, float]
    """Seconds: node lost -> shrink decision -> first shrunk step; replacement scheduled -> grow decision
    -> first full step."""

    @property
    def bit_identical(self) -> bool:
        return self.chaos_sha256 == self.reference_sha256

    @property
    def passed(self) -> bool:
        shrunk = any(gen.world_size < gen.full_world_size for gen in self.generations)
        grew = (
            bool(self.generations) and self.generations[-1].world_size == self.generations[-1].full_world_size
        )
        return shrunk and grew and not self.problems and self.bit_identical

    def retrained(self) -> dict[str, int]:
        """Steps a generation trained past the step the next one restored, per size change: what each
        shrink (the newest durable step before the loss) and each grow (a durable step committed after
        the replacement came) cost in steps."""
        out: dict[str, int] = {}
        for gen, after in itertools.pairwise(self.generations):
            seq = next(iter(gen.steps.values()), [])
            name = "shrink" if after.world_size < gen.world_size else "grow"
            out[f"{name} to {after.world_size} ranks"] = (seq[-1] if seq else after.restored) - after.restored
        return out

    def lines(self) -> list[str]:
        out = [
            f"generation {i}: {g.world_size} of {g.full_world_size} ranks, restored step {g.restored}, "
            f"trained {_span(g)}"
            for i, g in enumerate(self.generations)
        ]
        out += [f"{name}: {seconds:.1f} s" for name, seconds in self.phases.items()]
        out += [f"steps trained again at the {name}: {count}" for name, count in self.retrained().items()]
        out.append(
            "every step trained exactly once after each restored step"
            if not self.problems
            else "lineage problems: " + "; ".join(self.problems)
        )
        if self.bit_identical:
            out.append(
                f"final parameters bit-identical to the reference that follows the same sizes "
                f"(sha256 {self.chaos_sha256[:16]})"
            )
        else:
            out.append(f"final parameters differ from the reference: {self.difference}")
        return out


def _span(gen: Generation) -> str:
    seq = next(iter(gen.steps.values()), [])
    return f"steps {seq[0]}..{seq[-1]}" if seq else "no step"


def phases(run_dir: Path, gens: list[Generation], store_log: Path) -> dict[str, float]:
    """The scenario's phases from the executor's, the control process's and the ranks' records."""
    executor = [json.loads(line) for line in (run_dir / "executor.jsonl").read_text().splitlines()]
    lost = next((e["t"] for e in executor if e["kind"] == "delete_node"), None)
    lost_index = next((e["index"] for e in executor if e["kind"] == "delete_node"), None)
    back = next(
        (
            e["t"]
            for e in executor
            if lost is not None and e["kind"] == "pod_start" and e["index"] == lost_index and e["t"] > lost
        ),
        None,
    )
    shrinks, grows = control_decisions(store_log)
    shrunk = next((g for g in gens if g.world_size < g.full_world_size), None)
    regrown = next(
        (
            g
            for g in gens[1:]
            if shrunk is not None and g.started > shrunk.started and g.world_size == g.full_world_size
        ),
        None,
    )
    out: dict[str, float] = {}
    if lost is not None and shrinks:
        out["node lost -> shrink decision"] = shrinks[0] - lost
        if shrunk is not None and shrunk.first_step_t is not None:
            out["shrink decision -> first step on fewer nodes"] = shrunk.first_step_t - shrinks[0]
    if back is not None and grows:
        out["replacement scheduled -> grow decision"] = grows[0] - back
        if regrown is not None and regrown.first_step_t is not None:
            out["grow decision -> first step at full size"] = regrown.first_step_t - grows[0]
    return out


def run_shrink_scenario(
    values_path: Path,
    *,
    run_dir: Path,
    overrides: tuple[str, ...] = (),
    hold_s: float = HOLD_S,
    timeout_s: float = 600.0,
) -> ShrinkReport:
    """Render the values with `SHRINK_OVERRIDES` (then `overrides`), run them with the lost node's
    replacement held Pending `hold_s`, and judge the run against its reference (`ShrinkReport`).
    RunFailed when the job does not complete."""
    from nvrx_eks.k8s.job_chart import render  # noqa: PLC0415
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415
    from nvrx_eks.localrun.chaos import RunFailed, trainer_run_dir  # noqa: PLC0415
    from nvrx_eks.localrun.executor import LocalJob  # noqa: PLC0415
    from nvrx_eks.localrun.numerics import compare  # noqa: PLC0415
    from nvrx_eks.training.attempt import FINAL_STATE  # noqa: PLC0415

    values = load_values(values_path, (*SHRINK_OVERRIDES, *overrides))
    dist = run_dir / "dist"
    render(values, str(dist))
    job = LocalJob(dist, run_dir=run_dir, timeout_s=timeout_s, node_provision_s=hold_s)
    result = job.run()
    if not result.succeeded:
        raise RunFailed(result.reason, user_error=result.user_error, logs=run_dir / "pods")
    events_root = trainer_run_dir(values, run_dir)
    gens = generations(read_events(events_root))
    steps = int(values.entrypoint.args[list(values.entrypoint.args).index("--steps") + 1])
    # The store pod's log (the rendezvous store's Deployment: the control process's decisions).
    store_logs = sorted((run_dir / "pods").glob(f"{values.name}-rdzv-*.log"))
    store_log = store_logs[0] if store_logs else None
    chaos_sha = str(json.loads((events_root / "final.json").read_text())["final_params_sha256"])
    reference, reference_state = reference_sha256(values, gens, run_dir=run_dir / "reference")
    difference = None if chaos_sha == reference else compare(events_root / FINAL_STATE, reference_state)
    return ShrinkReport(
        generations=gens,
        problems=lineage_problems(gens, steps),
        chaos_sha256=chaos_sha,
        reference_sha256=reference,
        difference=difference,
        phases=phases(run_dir, gens, store_log) if store_log is not None else {},
    )
