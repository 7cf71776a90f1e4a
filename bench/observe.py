"""`make observe-check`: the dashboard and the alert rules against a real Prometheus, on this machine.

1. render the monitoring objects the cluster chart ships with the Prometheus Operator on (the
   PodMonitors, the PrometheusRule) and turn the trainer's PodMonitor into the scrape configuration
   the operator generates for it (k8s/observability.py `scrape_configs`: the same relabeling);
2. start Prometheus (Debian's `prometheus`, on loopback, its own config and a temporary store) with
   those scrape configurations and the alert rules;
3. run the local job (k8s/values/local-cpu.yaml) with faults of each recovery layer, each rank serving
   /metrics on its pod's address; Prometheus discovers every pod as Kubernetes would describe it (the
   `__meta_kubernetes_*` labels of the rendered pod template, through a file that follows the executor's
   pod starts and ends) and scrapes each rank through that relabeling;
4. evaluate every dashboard query over the run through Prometheus's HTTP API: each must return data
   (the queries of the DCGM exporter need a GPU node: counted apart, not run); check that Prometheus
   evaluated every alert rule on the scraped series without an error;
5. `promtool test rules`: the rules' unit tests (k8s/alerts/rules_test.yaml) against the rendered rules.

Exit 0 when everything held; 1 otherwise; 2 when prometheus or promtool is not installed.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import yaml

from nvrx_eks.kitcore.ports import ReservedPort

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rich.console import Console

SCRAPE_INTERVAL_S = 1
"""The PodMonitor's 30 s would see a one-minute job twice; relabeling, not timing, is under test."""
OBSERVE_FAULTS = ("exception@30:1", "sigkill@60:1", "node_loss@90:3")
"""One fault per recovery layer (in process, ft_launcher, Job controller): every recovery series has data."""
OBSERVE_STEPS = 120
EMULATED_STEP_S = 0.1
"""Steps long enough that each process lives for several scrapes."""
PROMETHEUS_START_S = 30.0
INSTALL_HINT = "apt-get install -y prometheus (Debian's package ships prometheus and promtool)"


@dataclass(frozen=True)
class QueryResult:
    title: str
    expr: str
    series: int
    error: str = ""


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, query) for every target of every panel, rows' panels included."""
    found: list[tuple[str, str]] = []

    def panels(items: list[dict[str, Any]]) -> None:
        for panel in items:
            found.extend((panel["title"], t["expr"]) for t in panel.get("targets", []) if t.get("expr"))
            panels(panel.get("panels", []))

    panels(dashboard["panels"])
    return found


def needs_gpu(expr: str) -> bool:
    """Whether the query reads the DCGM exporter, which runs only on a GPU node."""
    from nvrx_eks.k8s.observability import DCGM_EXPORTER_METRICS  # noqa: PLC0415

    return any(re.search(rf"\b{name}\b", expr) for name in DCGM_EXPORTER_METRICS)


def grafana_expr(expr: str, *, namespace: str, range_s: int, rate_interval_s: int) -> str:
    """The query as Grafana sends it: its variables replaced by what they stand for in this run."""
    return (
        expr.replace("$__rate_interval", f"{rate_interval_s}s")
        .replace("$__range", f"{range_s}s")
        .replace("$namespace", re.escape(namespace))
    )


class Prometheus:
    """A Prometheus process on loopback with its own config and store, for the life of a `with`."""

    def __init__(self, workdir: Path, config: dict[str, Any], rules: dict[str, Any]) -> None:
        self.workdir = workdir
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        (workdir / "alerts.rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
        # Held until Prometheus has exited (its Go listener binds beside the hold: kitcore/ports.py).
        self._port = ReservedPort()
        self.port = self._port.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def __enter__(self) -> Self:
        self._log = log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + PROMETHEUS_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer,  # noqa: S310 - loopback
            ):
                if answer.status == 200:
                    return self
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"prometheus not ready after {PROMETHEUS_START_S:.0f} s: {self.log_tail()}")

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        if self._log is not None:
            self._log.close()
        self._port.release()

    def log_tail(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def api(self, path: str, **params: str) -> Any:  # noqa: ANN401 - JSON
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - loopback
            document = json.load(answer)
        if document.get("status") != "success":
            raise RuntimeError(f"{path}: {document.get('error', document)}")
        return document["data"]


class PodDiscovery:
    """The job's pods as Prometheus's Kubernetes discovery describes them, in a file_sd file that
    follows the executor's pod starts and ends (`<run>/executor.jsonl`).

    Each trainer pod gives one target per container port, at the pod's address (the executor's
    loopback address for its index, as the ranks bind it) with the meta labels Kubernetes discovery
    sets: namespace, pod name, phase, node name, container name and port name, and every pod label
    (value and presence) of the rendered pod template.
    """

    def __init__(self, run_dir: Path, targets_file: Path) -> None:
        self.run_dir = run_dir
        self.targets_file = targets_file
        self.pods: dict[str, dict[str, Any]] = {}
        self._generation: dict[int, int] = {}
        self._offset = 0
        self._template: dict[str, Any] | None = None
        self._namespace = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="pod-discovery", daemon=True)
        self._write()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _job_template(self) -> dict[str, Any] | None:
        for path in sorted((self.run_dir / "dist").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                if doc and doc.get("kind") == "Job":
                    self._namespace = doc["metadata"]["namespace"]
                    template: dict[str, Any] = doc["spec"]["template"]
                    return template
        return None

    def _follow(self) -> None:
        log = self.run_dir / "executor.jsonl"
        while not self._stop.wait(0.2):
            if self._template is None:
                self._template = self._job_template()
            if self._template is None or not log.exists():
                continue
            with log.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._offset += len(complete)
            changed = False
            for line in complete.decode(errors="replace").splitlines():
                event = json.loads(line)
                if event.get("kind") == "pod_start" and event.get("index") is not None:
                    index = int(event["index"])
                    self._generation[index] = self._generation.get(index, -1) + 1
                    self.pods[event["pod"]] = {"index": index, "generation": self._generation[index]}
                    changed = True
                elif event.get("kind") == "pod_end" and self.pods.pop(event.get("pod", ""), None):
                    changed = True
            if changed:
                self._write()

    def _targets(self) -> list[dict[str, Any]]:
        from nvrx_eks.k8s.observability import meta_label  # noqa: PLC0415
        from nvrx_eks.localrun.addresses import node_address  # noqa: PLC0415

        if self._template is None:
            return []
        labels = self._template["metadata"].get("labels", {})
        pod_labels = {meta_label(k): v for k, v in labels.items()} | {
            meta_label(k).replace("_pod_label_", "_pod_labelpresent_", 1): "true" for k in labels
        }
        groups: list[dict[str, Any]] = []
        for name, pod in sorted(self.pods.items()):
            address = node_address(pod["index"])
            meta = {
                "__meta_kubernetes_namespace": self._namespace,
                "__meta_kubernetes_pod_name": name,
                "__meta_kubernetes_pod_phase": "Running",
                "__meta_kubernetes_pod_ip": address,
                "__meta_kubernetes_pod_node_name": f"local-node-{pod['index']}-{pod['generation']}",
            }
            groups.extend(
                {
                    "targets": [f"{address}:{port['containerPort']}"],
                    "labels": pod_labels
                    | meta
                    | {
                        "__meta_kubernetes_pod_container_name": container["name"],
                        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    },
                }
                for container in self._template["spec"]["containers"]
                for port in container.get("ports", [])
            )
        return groups

    def _write(self) -> None:
        groups = self._targets()
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1), encoding="utf-8")
        tmp.replace(self.targets_file)  # one rename: Prometheus never reads half a file


def prometheus_config(pod_monitor: dict[str, Any], targets_file: Path) -> dict[str, Any]:
    """Prometheus's config: the PodMonitor's scrape configurations, discovering from `targets_file`."""
    from nvrx_eks.k8s.observability import scrape_configs  # noqa: PLC0415

    interval = f"{SCRAPE_INTERVAL_S}s"
    configs = [
        c | {"file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": interval}]}
        for c in scrape_configs(pod_monitor, interval=interval)
    ]
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": ["alerts.rules.yaml"],
        "scrape_configs": configs,
    }


def run_promtool_tests(rules: dict[str, Any], workdir: Path) -> tuple[bool, int, str]:
    """`promtool test rules` on the alert rules' unit tests; (passed, tests, output)."""
    from nvrx_eks.k8s.alerts import RULES_FILE, RULES_TEST  # noqa: PLC0415

    folder = workdir / "promtool"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RULES_FILE).write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    shutil.copyfile(RULES_TEST, folder / RULES_TEST.name)
    tests = yaml.safe_load(RULES_TEST.read_text(encoding="utf-8"))["tests"]
    count = sum(len(t.get("alert_rule_test", [])) for t in tests)
    promtool = shutil.which("promtool") or "promtool"
    checked = subprocess.run(
        [promtool, "check", "rules", RULES_FILE],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if checked.returncode != 0:
        return False, count, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", RULES_TEST.name],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return tested.returncode == 0, count, tested.stdout + tested.stderr


def evaluate_dashboard(
    prometheus: Prometheus, *, namespace: str, start: float, end: float
) -> tuple[list[QueryResult], int]:
    """Every trainer query of every shipped dashboard over [start, end]; and how many need a GPU."""
    from nvrx_eks.k8s.observability import dashboards  # noqa: PLC0415

    range_s = max(1, round(end - start))
    # Grafana's $__rate_interval: max(4 x scrape interval, query step + scrape interval).
    rate_interval_s = max(4 * SCRAPE_INTERVAL_S, 2 * SCRAPE_INTERVAL_S)
    results, gpu = [], 0
    for text in dashboards().values():
        for title, expr in dashboard_queries(json.loads(text)):
            if needs_gpu(expr):
                gpu += 1
                continue
            query = grafana_expr(expr, namespace=namespace, range_s=range_s, rate_interval_s=rate_interval_s)
            try:
                data = prometheus.api(
                    "query_range",
                    query=query,
                    start=f"{start:.3f}",
                    end=f"{end:.3f}",
                    step=f"{SCRAPE_INTERVAL_S}s",
                )
            except (OSError, RuntimeError) as exc:
                results.append(QueryResult(title, expr, 0, str(exc)))
                continue
            series = [s for s in data["result"] if s.get("values")]
            results.append(QueryResult(title, expr, len(series)))
    return results, gpu


def rule_health(prometheus: Prometheus) -> list[tuple[str, str, str]]:
    """(rule, health, last error) of every loaded alerting rule, as Prometheus evaluated it."""
    groups = prometheus.api("rules", type="alert")["groups"]
    return [(r["name"], r["health"], r.get("lastError", "")) for g in groups for r in g["rules"]]


@contextlib.contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="nvrx-observe-") as tmp:
        yield Path(tmp)


@dataclass(frozen=True)
class Findings:
    """What one observe-check found."""

    job_succeeded: bool
    job_reason: str
    scraped: list[dict[str, Any]]
    """Per pod that answered over the run: its labels (pod, node, training_job) and rank targets."""
    queries: list[QueryResult]
    gpu_queries: int
    rules: list[tuple[str, str, str]]
    promtool_passed: bool
    promtool_tests: int
    promtool_output: str


def observe_check(*, console: Console, workdir: Path | None = None, timeout_s: float = 480.0) -> int:
    """Run the check (module docstring); the process exit code."""
    missing = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
    if missing:
        console.print(f"[red]{' and '.join(missing)} not installed[/red]: {INSTALL_HINT}")
        return 2
    with _workdir(workdir) as work:
        findings = _run(console, work, timeout_s=timeout_s)
    return 0 if report(console, findings) else 1


def _run(console: Console, work: Path, *, timeout_s: float) -> Findings:
    from nvrx_eks.k8s.observability import MAX_LOCAL_RANKS  # noqa: PLC0415

    # Held for the run: each local rank's metrics endpoint binds the base port plus its local rank.
    with ReservedPort(count=MAX_LOCAL_RANKS) as metrics_ports:
        return _observe(console, work, timeout_s=timeout_s, metrics_port=metrics_ports.port)


def _observe(console: Console, work: Path, *, timeout_s: float, metrics_port: int) -> Findings:
    from nvrx_eks.k8s import DEFAULT_VALUES  # noqa: PLC0415
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415
    from nvrx_eks.k8s.observability import monitoring_objects  # noqa: PLC0415
    from nvrx_eks.localrun.chaos import reference_trainer, run_job  # noqa: PLC0415

    values = load_values(
        DEFAULT_VALUES,
        (
            *reference_trainer(steps=OBSERVE_STEPS, emulated_device_step_s=EMULATED_STEP_S),
            f"trainer.faults.plan={','.join(OBSERVE_FAULTS)}",
            f"trainer.metrics.prometheus_port={metrics_port}",
        ),
    )
    objects = monitoring_objects(values.namespace)
    (pod_monitor,) = [
        o for o in objects if o["kind"] == "PodMonitor" and o["metadata"]["namespace"] == values.namespace
    ]
    (rule_object,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    rules = {"groups": rule_object["spec"]["groups"]}
    run_dir = work / "job"
    run_dir.mkdir(parents=True, exist_ok=True)
    targets_file = work / "targets.json"
    discovery = PodDiscovery(run_dir, targets_file)
    config = prometheus_config(pod_monitor, targets_file)
    with Prometheus(work, config, rules) as prometheus, discovery:
        console.print(
            f"prometheus {prometheus.url}: {len(config['scrape_configs'])} scrape configs from "
            f"PodMonitor {pod_monitor['metadata']['name']}, every {SCRAPE_INTERVAL_S} s"
        )
        start = time.time()
        outcome = run_job(values, run_dir=run_dir, console=console, label="observe", timeout_s=timeout_s)
        time.sleep(2 * SCRAPE_INTERVAL_S)  # the last scrapes of the run
        end = time.time()
        # Targets that answered at least once over the run, by the pod and node they came from.
        scraped = prometheus.api(
            "query",
            query=f"count by (pod, node, training_job) (max_over_time(up[{round(end - start) + 1}s]) == 1)",
            time=f"{end:.3f}",
        )["result"]
        queries, gpu = evaluate_dashboard(prometheus, namespace=values.namespace, start=start, end=end)
        health = rule_health(prometheus)
    passed, tests, output = run_promtool_tests(rules, work)
    return Findings(
        job_succeeded=outcome.job.succeeded,
        job_reason=outcome.job.reason,
        scraped=scraped,
        queries=queries,
        gpu_queries=gpu,
        rules=health,
        promtool_passed=passed,
        promtool_tests=tests,
        promtool_output=output,
    )


def report(console: Console, found: Findings) -> bool:
    """Print what the check found; whether everything held."""
    from rich.table import Table  # noqa: PLC0415

    console.print(f"job {'succeeded' if found.job_succeeded else '[red]FAILED[/red]'}: {found.job_reason}")
    targets = sum(int(row["value"][1]) for row in found.scraped)
    labelled = all(row["metric"].get("node") and row["metric"].get("training_job") for row in found.scraped)
    labels = "each with its node and training_job" if labelled else "[red]without node or training_job[/red]"
    console.print(
        f"scraped {targets} rank targets of {len(found.scraped)} pods through the PodMonitor's relabeling"
    )
    console.print(f"  ({labels})")
    table = Table(title="Dashboard queries over the run", title_justify="left")
    table.add_column("data", no_wrap=True)
    table.add_column("panel")
    table.add_column("query")
    table.add_column("series", justify="right")
    for result in found.queries:
        mark = "ok" if result.series else f"[red]NO DATA[/red]{' ' + result.error if result.error else ''}"
        table.add_row(mark, result.title, result.expr, str(result.series))
    console.print(table)
    with_data = sum(1 for r in found.queries if r.series)
    console.print(
        f"{with_data}/{len(found.queries)} dashboard queries returned data "
        f"({found.gpu_queries} more read the DCGM exporter, which needs a GPU node: not run here)"
    )
    bad_rules = [(name, h, err) for name, h, err in found.rules if h != "ok"]
    for name, h, err in bad_rules:
        console.print(f"  [red]rule {name}: {h} {err}[/red]")
    console.print(
        f"{len(found.rules) - len(bad_rules)}/{len(found.rules)} alert rules evaluated on the scraped "
        "series without error"
    )
    if found.promtool_passed:
        console.print(f"promtool: {found.promtool_tests} rule tests passed")
    else:
        console.print(f"[red]promtool: rule tests failed[/red]\n{found.promtool_output}")
    return (
        found.job_succeeded
        and labelled
        and bool(found.scraped)
        and bool(found.queries)
        and with_data == len(found.queries)
        and bool(found.rules)
        and not bad_rules
        and found.promtool_passed
    )


def main() -> None:
    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415

    sys.exit(observe_check(console=make_console()))


if __name__ == "__main__":
    main()
