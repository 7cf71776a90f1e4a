"""`nvrx-eks demo`: the kit end to end on one machine, no AWS, no GPU.

1. synthesize the CDK app (offline) and summarize the stacks and GPU node groups;
2. render the local job (2 nodes x 2 CPU ranks, mode `both`) with a fault schedule holding every class;
3. run the fault-free reference once (cached per configuration and trainer code);
4. run the rendered job with the local executor, the trainer injecting the faults;
5. report: one row per fault, the run's goodput figures, summary.json, events, timeline.png and
   report.html (the same on one self-contained page), headed by what ran.

It stops at the first step that cannot be compared with anything: a module or script that is not there
(before anything is rendered), a fault-free reference that failed (no chaos run), a chaos run that never
trained (no report). Its reason is the job's, in one line; the exit code 2 when the job's input or the
script is to blame (the same at every restart), 1 otherwise.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.infra import DEFAULT_CONFIG
from nvrx_eks.k8s import DEFAULT_VALUES
from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE, UserError

if TYPE_CHECKING:
    from rich.console import Console

    from nvrx_eks.k8s.values import JobValues
    from nvrx_eks.localrun.chaos import ChaosResult, RunFailed


# One fault of every class training/faults.py injects, spaced so each recovery completes before the
# next fault. Ranks 2-3 live on node 1, so the node loss takes the node that does not host rank 0.
DEMO_FAULTS = (
    "exception@8:1",
    "hang@16:2",
    "oom@24:3",
    "skip_collective@32:0",
    "sigkill@40:1",
    "deadlock@50:2",
    "node_loss@60:3",
)


def demo_values(values_path: Path, overrides: tuple[str, ...] = ()) -> JobValues:
    """The demo's job: the values with every fault of DEMO_FAULTS planned. The script runs the steps its
    args give (k8s/values/local-cpu.yaml: 80); its ranks refuse a plan past them, exit 2, before
    anything is lost."""
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415

    return load_values(values_path, (f"trainer.faults.plan={','.join(DEMO_FAULTS)}", *overrides))


def demo(
    *,
    values_path: Path = DEFAULT_VALUES,
    cluster_config: Path = DEFAULT_CONFIG,
    runs_root: Path = Path("runs"),
    overrides: tuple[str, ...] = (),
    skip_synth: bool = False,
    timeout_s: float = 600.0,
    cache_dir: Path | None = None,
) -> int:
    """Run the demo; returns the process exit code (0: every fault recovered, bit-identical result).
    `cache_dir`: where fault-free references are kept (default: RUNS/.cache)."""
    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415
    from nvrx_eks.localrun.chaos import (  # noqa: PLC0415
        RunFailed,
        fault_free_sha256,
        fault_free_state,
        local_entry_problem,
        run_job,
    )

    console = make_console()
    started = time.monotonic()

    # The values first: a bad file or override, or an entry point that is not there, is one message at
    # once, not after the synth.
    plan = ",".join(DEMO_FAULTS)
    values = demo_values(values_path, overrides)
    problem = local_entry_problem(values)
    if problem is not None:
        raise UserError(problem)
    run_dir = (runs_root / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)

    _show_cluster(console, cluster_config, skip_synth=skip_synth)

    console.rule("2. Job (cdk8s render)")
    ran, runs = _what_runs(values)
    console.print(
        f"{values_path}: {values.num_nodes} nodes x {values.profile.workers_per_node} ranks, mode "
        f"{values.mode}, NVRx {values.resolved_nvrx_version}, {runs}; faults: {plan}"
    )

    console.rule("3. Fault-free reference")
    try:
        reference = fault_free_sha256(
            values,
            cache_dir=cache_dir or runs_root / ".cache",
            run_dir=run_dir / "fault-free",
            console=console,
            timeout_s=timeout_s,
        )
    except RunFailed as failed:
        return _stopped(console, "the fault-free reference failed", failed)
    # Found now, by the key the reference was kept under: the key hashes the checkout's trainer code.
    reference_state = fault_free_state(values, cache_dir=cache_dir or runs_root / ".cache")

    console.rule("4. Chaos run (local executor plays the Job controller)")
    outcome = run_job(values, run_dir=run_dir / "chaos", console=console, label="chaos", timeout_s=timeout_s)
    _show_job(console, outcome)
    if not outcome.job.succeeded and (outcome.job.user_error or not trained(outcome.trainer_run_dir)):
        chaos = RunFailed(
            outcome.job.reason, user_error=outcome.job.user_error, logs=run_dir / "chaos" / "pods"
        )
        return _stopped(console, "the chaos run failed", chaos)

    console.rule("5. Report")
    document = _report(
        console,
        outcome,
        run_dir,
        reference=reference,
        ran={"entrypoint": ran, "values": str(values_path)},
        reference_state=reference_state,
    )
    console.print(f"demo took {time.monotonic() - started:.0f} s")
    unmet = unmet_claims(document, job_succeeded=outcome.job.succeeded)
    if unmet:
        console.print("[red]the demo did not meet its claims; see the table and the pod logs:[/red]")
        for claim in unmet:
            console.print(f"  {claim}", markup=False, highlight=False, soft_wrap=True)
    return 1 if unmet else 0


def _show_cluster(console: Console, cluster_config: Path, *, skip_synth: bool) -> None:
    """Step 1: the stacks and GPU node groups the cluster config synthesizes to (offline)."""
    console.rule("1. Cluster (CDK synth, offline)")
    if skip_synth:
        console.print("skipped (--skip-synth)")
        return
    from nvrx_eks.infra.app import synth_summary  # noqa: PLC0415

    console.print(synth_summary(cluster_config, ()))


def _show_job(console: Console, outcome: ChaosResult) -> None:
    """The chaos run's pods, how each ended, and the Job's verdict."""
    from rich.markup import escape  # noqa: PLC0415

    for pod in outcome.job.pods:
        console.print(f"  pod {pod.pod:28} {pod.reason:12} exit={pod.exit_code}")
    verdict = "succeeded" if outcome.job.succeeded else "[red]FAILED[/red]"
    console.print(f"job {verdict}: {escape(outcome.job.reason)}", highlight=False, soft_wrap=True)


def unmet_claims(document: dict[str, Any], *, job_succeeded: bool) -> list[str]:
    """The demo's claims the report does not show, one line each: the Job succeeded, every fault
    recovered at the layer expected, every class of DEMO_FAULTS injected, the result bit-identical or
    its difference explained."""
    unmet = [] if job_succeeded else ["the chaos Job did not succeed"]
    unmet += [
        f"{f['class']} at step {f['step']} was recovered by {f['layer']}, not {f.get('expected_layer')}"
        for f in document["faults"]
        if f["layer"] != f.get("expected_layer")
    ]
    missing = {item.split("@")[0] for item in DEMO_FAULTS} - {f["class"] for f in document["faults"]}
    unmet += [f"no {cls} fault was injected" for cls in sorted(missing)]
    if not (document["bit_identical"] or document["numerics"]["explained"]):
        unmet.append("the final parameters differ from the fault-free run's, with no reason found")
    return unmet


def _report(
    console: Console,
    outcome: ChaosResult,
    run_dir: Path,
    *,
    reference: str | None,
    ran: dict[str, str],
    reference_state: Path | None,
) -> dict[str, Any]:
    """The chaos run's report: the table, summary.json, the timeline and report.html; the summary."""
    from nvrx_eks.localrun.numerics import compare, verdict  # noqa: PLC0415
    from nvrx_eks.localrun.report import (  # noqa: PLC0415
        plot_timeline,
        print_report,
        summary_document,
        write_html_report,
        write_summary,
    )
    from nvrx_eks.localrun.summary import summarize  # noqa: PLC0415
    from nvrx_eks.training.attempt import FINAL_STATE  # noqa: PLC0415
    from nvrx_eks.training.events import read_events  # noqa: PLC0415

    document = summary_document(summarize(outcome.trainer_run_dir), fault_free_sha256=reference, ran=ran)
    parallelism = {
        str(event["parallelism"])
        for event in read_events(outcome.trainer_run_dir)
        if event["kind"] == "startup_done" and "parallelism" in event
    }
    difference = None
    if not document["bit_identical"]:
        difference = compare(outcome.trainer_run_dir / FINAL_STATE, reference_state)
    document["numerics"] = verdict(document, difference, parallelism)
    print_report(console, document, run_dir)
    summary_path = write_summary(run_dir, document)
    timeline = plot_timeline(outcome.trainer_run_dir, document, out=run_dir / "timeline.png")
    console.print(f"summary:  {summary_path}")
    console.print(f"events:   {outcome.trainer_run_dir / 'events'}")
    console.print(f"timeline: {timeline}")
    page = write_html_report(
        run_dir, document, outcome.trainer_run_dir, title=f"nvrx-eks demo {run_dir.name}"
    )
    console.print(f"report:   {page}")
    console.print(f"pod logs: {run_dir / 'chaos' / 'pods'}")
    return document


def _what_runs(values: JobValues) -> tuple[str, str]:
    """(the command every rank runs, as the report names it; its steps or arguments, for the header)."""
    from nvrx_eks.k8s.sections import REFERENCE_TRAINER_MODULE  # noqa: PLC0415

    runs = " ".join(values.entrypoint.command())
    reference = " (the reference trainer)" if values.entrypoint.module == REFERENCE_TRAINER_MODULE else ""
    return f"python {runs}{reference}", runs


def trained(trainer_run_dir: Path) -> bool:
    """Whether a run's ranks started at all (a `process_start` event): else there is nothing to report."""
    from nvrx_eks.training.events import read_events  # noqa: PLC0415

    try:
        return any(event["kind"] == "process_start" for event in read_events(trainer_run_dir))
    except FileNotFoundError:
        return False


def _stopped(console: Console, what: str, failed: RunFailed) -> int:
    """The demo ends at a run that failed: its reason in one line, no report of a run that did not happen."""
    console.print(f"{what}: {failed.reason}", markup=False, highlight=False, style="red", soft_wrap=True)
    console.print(f"pod logs: {failed.logs}", markup=False, highlight=False)
    return USER_ERROR_EXIT_CODE if failed.user_error else 1
