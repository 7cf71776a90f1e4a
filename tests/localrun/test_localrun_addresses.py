"""localrun/addresses.py: the local nodes' loopback addresses are named in /etc/hosts in the form torch
looks them up (IPv4-mapped IPv6), and a local run says which are not."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.load import load_values
from nvrx_eks.localrun import addresses, executor
from nvrx_eks.localrun.addresses import missing, missing_lines, run_addresses

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "k8s" / "values" / "local-cpu.yaml"
IPV4_ONLY = "127.0.0.1 localhost\n127.0.0.2 node-a\n127.0.0.3 node-b  # two nodes\n"


def test_an_address_named_only_in_ipv4_form_is_missing_for_torchs_ipv6_sockets():
    assert missing(IPV4_ONLY, ["127.0.0.2"]) == ["127.0.0.2"]
    assert missing(IPV4_ONLY + "::ffff:127.0.0.2 node-a\n", ["127.0.0.2", "127.0.0.3"]) == ["127.0.0.3"]
    assert missing("::ffff:127.0.0.4\n127.0.0.4\n", ["127.0.0.4"]) == ["127.0.0.4"]  # no name given
    assert missing_lines(IPV4_ONLY, ["127.0.0.1", "127.0.0.2"]) == [
        "::ffff:127.0.0.1 nvrx-local-system",
        "::ffff:127.0.0.2 nvrx-local-node-0",
    ]


def test_adding_appends_only_the_missing_names_once_and_keeps_every_line(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(IPV4_ONLY.rstrip("\n"))  # no newline at the end
    script = [sys.executable, str(REPO / "localrun" / "addresses.py"), "--hosts", str(hosts), "--add", "3"]
    for _ in range(2):
        done = subprocess.run(script, capture_output=True, text=True, timeout=30, check=True)
    assert "0 names" in done.stdout  # the second time: nothing left to add
    text = hosts.read_text()
    assert text.startswith(IPV4_ONLY)
    assert missing(text, run_addresses(3)) == []
    assert text.count("::ffff:127.0.0.2 ") == 1


def test_a_local_run_says_which_of_its_addresses_have_no_name(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts"
    hosts.write_text(IPV4_ONLY)
    monkeypatch.setattr(executor, "HOSTS", hosts)
    dist = tmp_path / "dist"
    render(load_values(LOCAL, []), str(dist))
    said: list[str] = []
    job = executor.LocalJob(dist, run_dir=tmp_path / "run", echo=said.append)
    (tmp_path / "run").mkdir()
    job._say_unnamed_addresses()
    (line,) = said
    assert f"{job.completions + 1} local node addresses (127.0.0.1..127.0.0.{job.completions + 1})" in line
    assert "localrun/addresses.py --add" in line
    (event,) = [json.loads(e) for e in (tmp_path / "run" / "executor.jsonl").read_text().splitlines()]
    assert event["kind"] == "addresses_unnamed"

    hosts.write_text("\n".join(missing_lines("", run_addresses(job.completions))) + "\n")
    said.clear()
    job._say_unnamed_addresses()
    assert said == []


def test_this_machine_names_the_addresses_the_suites_local_runs_use():
    """Without the names, a DNS server that drops a reverse query stalls a store connection 5 s, and the
    suite's in-process recoveries turned into launcher restarts now and then (.ci/run adds them)."""
    lacking = missing(addresses.HOSTS.read_text(encoding="utf-8"), run_addresses(8))
    assert not lacking, (
        f"run `sudo python3 localrun/addresses.py --add`: {addresses.HOSTS} does not name {lacking}"
    )
    assert socket.getnameinfo(("::ffff:127.0.0.2", 0, 0, 0), socket.NI_NAMEREQD)[0]
