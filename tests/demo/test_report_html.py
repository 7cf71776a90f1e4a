"""report.html: self-contained, the table and the timeline render in a real browser, labels never overlap.

The browser is Debian's chromium (`apt-get install -y chromium`); where /usr/bin/chromium is absent
the browser tests skip with that reason, the layout and HTML tests still run.
"""

from __future__ import annotations

import html
import itertools
import json
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvrx_eks.localrun.report import (
    LABEL_FONT_PX,
    LABEL_GAP_PX,
    LANE_HEIGHT_PX,
    PHASE_BAR_PX,
    REPORT_FILE,
    place_labels,
    render_html,
    report_run,
    summary_document,
    write_html_report,
    write_summary,
)
from nvrx_eks.localrun.summary import summarize
from nvrx_eks.training.events import read_events

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium (/usr/bin/chromium): apt-get install -y chromium"
)
CLASSES = ("exception", "hang", "oom", "skip_collective", "sigkill", "deadlock", "node_loss")


def _overlapping(boxes) -> list[tuple[int, int]]:
    """Pairs of label boxes whose rectangles (x, lane band) intersect."""
    return [
        (a.index, b.index)
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
        if a.lane == b.lane and a.x < b.x + b.width and b.x < a.x + a.width
    ]


@given(
    st.lists(
        st.tuples(st.floats(min_value=0, max_value=1200), st.sampled_from(CLASSES), st.sampled_from(CLASSES)),
        max_size=60,
    )
)
def test_labels_in_lanes_never_overlap(faults):
    anchors = [(x, f"{cls} > {layer}") for x, cls, layer in faults]
    boxes = place_labels(anchors, left=60, right=1080)
    assert sorted(b.index for b in boxes) == list(range(len(anchors)))
    assert _overlapping(boxes) == []
    for box in boxes:
        assert box.x >= 60
        assert box.x + box.width <= 1080 + 1e-9
    # Same-lane neighbours keep the gap.
    for lane in {b.lane for b in boxes}:
        row = sorted((b for b in boxes if b.lane == lane), key=lambda b: b.x)
        for a, b in itertools.pairwise(row):
            assert b.x - (a.x + a.width) >= LABEL_GAP_PX - 1e-9
    assert LANE_HEIGHT_PX > LABEL_FONT_PX * 1.2  # lanes are further apart than a line of text is tall


def test_a_naive_layout_would_overlap():
    """The test above can fail: the same close faults all on one line do overlap."""
    anchors = [(100 + i, "exception > inprocess") for i in range(5)]
    boxes = place_labels(anchors, left=60, right=1080)
    assert len({b.lane for b in boxes}) == 5
    flat = [type(b)(index=b.index, text=b.text, x=b.x, width=b.width, lane=0) for b in boxes]
    assert _overlapping(flat)


def _write(run_dir: Path, rank: int, events: list[dict]) -> None:
    path = run_dir / "events" / f"rank-{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for event in events:
            f.write(json.dumps({"rank": rank, "restart": 0, "node": "0", "pid": 1} | event) + "\n")


def _storm_run(run_dir: Path, *, faults: int = 14) -> None:
    """One rank, 40 steps, `faults` in-process faults 0.2 s apart from step 10 on: labels crowd."""
    events = [
        {"t": 0.0, "kind": "process_start", "mode": "both", "steps": 40},
        {
            "t": 0.5,
            "kind": "startup_done",
            "restored_step": -1,
            "tier": "none",
            "state_bytes": 4_000_000,
            "memcpy_gbps": 4.0,
        },
    ]
    t = 1.0
    for step in range(40):
        events.append(
            {"t": t, "kind": "step", "step": step, "step_s": 0.1, "ckpt_s": 0.001, "loss": 4 - step / 20}
        )
        if 10 <= step < 10 + faults:
            cls = CLASSES[step % 4]
            events += [
                {
                    "t": t + 0.02,
                    "kind": "fault_injected",
                    "class": cls,
                    "step": step + 1,
                    "target_rank": 0,
                    "expected_layer": "inprocess",
                    "index": step - 10,
                },
                {"t": t + 0.05, "kind": "detected", "layer": "inprocess", "cause": "InjectedFaultError"},
                {
                    "t": t + 0.15,
                    "kind": "startup_done",
                    "restored_step": step,
                    "tier": "inprocess",
                    "state_bytes": 4_000_000,
                    "memcpy_gbps": 4.0,
                },
            ]
            t += 0.2
        else:
            t += 0.5
    events.append({"t": t, "kind": "end", "steps": 40, "final_params_sha256": "a" * 64})
    _write(run_dir, 0, events)


@pytest.fixture
def storm(tmp_path) -> tuple[Path, dict]:
    run = tmp_path / "run"
    _storm_run(run)
    document = summary_document(summarize(run), fault_free_sha256="a" * 64)
    return run, document


def _label_rects(svg: ET.Element) -> list[tuple[float, float, float, float]]:
    ns = "{http://www.w3.org/2000/svg}"
    rects = []
    for text in svg.iter(f"{ns}text"):
        if text.get("class") == "fault-label":
            x, y, w = float(text.get("x")), float(text.get("y")), float(text.get("textLength"))
            size = float(text.get("font-size"))
            rects.append((x, y - size, x + w, y + 0.25 * size))  # ascent above, descent below the baseline
    return rects


def _intersect(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_report_page_is_self_contained_with_table_timeline_and_verdict(storm):
    run, document = storm
    path = write_html_report(run, document, run)
    text = path.read_text()
    assert path.name == REPORT_FILE
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text)  # nothing fetched
    assert "<script" not in text
    assert "bit-identical to the fault-free run" in text
    assert text.count("<tr><td>") == len(document["faults"]) == 14
    svg = ET.fromstring(  # noqa: S314 - the page this test just wrote
        re.search(r"<svg.*?</svg>", text, re.DOTALL).group(0)
    )
    rects = _label_rects(svg)
    assert len(rects) == 14
    assert not [(a, b) for i, a in enumerate(rects) for b in rects[i + 1 :] if _intersect(a, b)]
    wrong = document | {"bit_identical": False, "faults": [document["faults"][0] | {"layer": "ft_launcher"}]}
    page = render_html(wrong, read_events(run), title="t")
    assert "NOT bit-identical" in page
    assert "ft_launcher (not inprocess)" in page


def test_report_command_finds_the_faulty_run_in_a_demo_folder(storm, tmp_path, nvrx_eks):
    run, document = storm
    demo = tmp_path / "demo-1"
    shutil.copytree(run, demo / "chaos" / "trainer")
    shutil.copytree(run, demo / "fault-free" / "trainer")  # the reference is not what gets reported
    write_summary(demo, document)
    assert report_run(demo) == demo / REPORT_FILE
    (demo / REPORT_FILE).unlink()
    done = nvrx_eks("report", str(demo), timeout=120)
    assert done.returncode == 0, done.stderr
    assert (demo / REPORT_FILE).is_file()
    missing = nvrx_eks("report", str(tmp_path / "nope"), timeout=120)
    assert missing.returncode == 2
    # Refused while parsing, naming the argument (typer's error box; its line wrapping removed).
    message = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", missing.stderr))
    assert "Invalid value for 'RUN_DIR'" in message
    assert "no such folder; pass an existing run folder" in message
    assert "Traceback" not in missing.stderr


# A check the test adds to a copy of the page: what the browser laid out, measured by the browser.
_MEASURE = """<script>
const labels = [...document.querySelectorAll('.fault-label')].map(e => e.getBoundingClientRect());
let overlaps = 0;
for (let i = 0; i < labels.length; i++) for (let j = i + 1; j < labels.length; j++) {
  const a = labels[i], b = labels[j];
  if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) overlaps++;
}
const svg = document.getElementById('timeline').getBoundingClientRect();
document.body.setAttribute('data-labels', labels.length);
document.body.setAttribute('data-overlaps', overlaps);
document.body.setAttribute('data-rows', document.querySelectorAll('#faults tbody tr').length);
document.body.setAttribute('data-svg', Math.round(svg.width) + 'x' + Math.round(svg.height));
</script></body>"""


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@needs_chromium
def test_chromium_renders_the_table_and_the_timeline_without_overlapping_labels(storm, tmp_path):
    run, document = storm
    page = write_html_report(run, document, run)
    probe = tmp_path / "measured.html"
    probe.write_text(page.read_text().replace("</body>", _MEASURE))
    dom = _chromium("--dump-dom", probe.as_uri(), profile=tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    measured = dict(re.findall(r'data-(\w+)="([^"]*)"', body))
    assert measured["labels"] == "14"
    assert measured["overlaps"] == "0"
    assert measured["rows"] == "14"
    width, height = map(int, measured["svg"].split("x"))
    assert width >= 1000
    assert height > 200
    shot = tmp_path / "report.png"
    done = _chromium(
        f"--screenshot={shot}", "--window-size=1200,1400", page.as_uri(), profile=tmp_path / "profile-shot"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1200, 1400)


def _phases_of(page: str) -> list[tuple[str, list[float], float, list[tuple[float, float]]]]:
    """(class, phase seconds, total, [(x, width) of each bar segment]) per row of the phases table."""
    table = re.search(r'<table id="phases">.*?</table>', page, re.DOTALL).group(0)
    rows = []
    for row in re.findall(r"<tr class='phase-row'>(.*?)</tr>", table, re.DOTALL):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)
        segments = [
            (float(x), float(w))
            for x, w in re.findall(r'<rect class="phase"[^>]* x="([\d.]+)"[^>]* width="([\d.]+)"', row)
        ]
        rows.append((cells[0], [float(c) for c in cells[2:8]], float(cells[8]), segments))
    return rows


def test_report_page_breaks_each_recovery_into_its_phases(storm):
    run, document = storm
    page = write_html_report(run, document, run).read_text()
    rows = _phases_of(page)
    assert [r[0] for r in rows] == [f["class"] for f in document["faults"]]
    longest = max(total for _, _, total, _ in rows)
    for (_, seconds, total, segments), fault in zip(rows, document["faults"], strict=True):
        expected = [
            fault["phases"][k]
            for k in ("detect_s", "teardown_s", "rendezvous_s", "start_s", "restore_s", "first_step_s")
        ]
        assert seconds == pytest.approx(expected, abs=0.005)
        assert total == pytest.approx(sum(expected), abs=0.01)
        # One segment per phase, in order, end to end; the bar's length is the total, to scale.
        assert len(segments) == 6
        for (x, w), (next_x, _) in itertools.pairwise(segments):
            assert next_x == pytest.approx(x + w, abs=0.02)
        assert sum(w for _, w in segments) / PHASE_BAR_PX == pytest.approx(total / longest, abs=0.01)
    assert "<script" not in page


_MEASURE_PHASES = """<script>
const bars = [...document.querySelectorAll('#phases .phase-bar')].map(bar => {
  const rects = [...bar.querySelectorAll('rect')].map(r => r.getBoundingClientRect());
  return rects.map(r => [r.left, r.width]);
});
const totals = [...document.querySelectorAll('#phases td.total')].map(td => td.textContent);
document.body.setAttribute('data-bars', JSON.stringify(bars));
document.body.setAttribute('data-totals', JSON.stringify(totals));
</script></body>"""


@needs_chromium
def test_chromium_draws_each_recovery_as_a_stacked_bar_to_scale(storm, tmp_path):
    run, document = storm
    page = write_html_report(run, document, run)
    probe = tmp_path / "phases.html"
    probe.write_text(page.read_text().replace("</body>", _MEASURE_PHASES))
    dom = _chromium("--dump-dom", probe.as_uri(), profile=tmp_path / "profile-phases")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    measured = {k: json.loads(html.unescape(v)) for k, v in re.findall(r'data-(\w+)="([^"]*)"', body)}
    bars, totals = measured["bars"], [float(t) for t in measured["totals"]]
    assert len(bars) == len(totals) == len(document["faults"])
    longest = max(totals)
    for bar, total in zip(bars, totals, strict=True):
        assert len(bar) == 6
        for (left, width), (next_left, _) in itertools.pairwise(bar):
            assert next_left == pytest.approx(left + width, abs=0.5)  # laid end to end by the browser
        drawn = bar[-1][0] + bar[-1][1] - bar[0][0]
        assert drawn == pytest.approx(total / longest * PHASE_BAR_PX, abs=1.0)
