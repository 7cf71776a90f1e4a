"""Why a process failed, told to the process that supervises it, in one line.

A training rank runs under a launcher (ft_launcher, torchrun): when it exits non-zero, the launcher
reads the rank's reason from the JSON file named by `TORCHELASTIC_ERROR_FILE` (torch.distributed.elastic's
`ErrorHandler` format) and prints it in its failure summary, which becomes the pod's termination
message, the job's failure reason and the line `nvrx-eks job status` and `nvrx-eks local run` print
(k8s/termination.py). A rank that writes nothing is reported as torch's generic "To enable traceback
see: https://pytorch.org/docs/stable/elastic/errors.html". So every way a rank ends with a message of
the kit's (`configio.exit_on_user_error`, the user's own exception: training/failures.py) writes it
here too, folded into one line: the summary keeps one line per rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Set by torch.distributed.elastic (and so ft_launcher) for every worker: where its reason goes."""
TORCH_NO_REASON = "To enable traceback see"
"""How torch's failure message for a worker begins when the worker wrote no reason."""
MAX_CHARS = 600
"""A reason's length at most: the kubelet keeps 2,048 bytes of a failed pod's log as its message."""

_told: list[str] = []
"""What this process told its launcher (the first reason is the one kept)."""


def one_line(text: str) -> str:
    """`text` folded into one readable line: a heading that ends in ':' runs into its first item, the
    items (`- item` lines, as `describe_validation_error` and a multi-part UserError list them) are
    joined by '; '."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    folded = lines[0]
    for line in lines[1:]:
        item = line.removeprefix("- ").removeprefix("* ")
        folded += (" " if folded.endswith(":") else "; ") + item
    return folded


def tell(reason: str, *, details: str = "") -> None:
    """Write `reason` (folded to one line) as this process's failure for its launcher; `details` (a
    traceback) goes beside it for whoever reads the file. Nothing when no launcher asked (no
    `TORCHELASTIC_ERROR_FILE`), and only the first reason of a process: the innermost handler saw the
    failure first and knows it best."""
    line = one_line(reason)[:MAX_CHARS]
    if _told:
        return
    _told.append(line)
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    document = {
        "message": {
            "message": line,
            "extraInfo": {"py_callstack": details, "timestamp": str(int(time.time()))},
        }
    }
    with contextlib.suppress(OSError):  # the reason is a courtesy; the exit code is the verdict
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(document), encoding="utf-8")


def told() -> str | None:
    """The reason this process told its launcher, if it did."""
    return _told[0] if _told else None
