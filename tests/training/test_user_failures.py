"""A user's script's failures, as its launcher, the job and the console get them: one line in the kit's
words in the launcher's error file (kitcore/supervisor.py), the user's own frame named, and a first
failure always retried (training/failures.py)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
from children import run_python

from nvrx_eks.kitcore.supervisor import ERROR_FILE_ENV, one_line
from nvrx_eks.training import api, failures, process
from nvrx_eks.training.attempt import Record
from nvrx_eks.training.resilience.config import CONFIG_ENV
from nvrx_eks.training.resilience.launch import entry_script

if TYPE_CHECKING:
    import subprocess

REPO = Path(__file__).resolve().parents[2]


def test_a_multi_line_message_is_folded_into_one_readable_line():
    text = "attempt.resume():\n  - data: a list has no state_dict()\n  - rng: the name is the kit's own"
    assert (
        one_line(text) == "attempt.resume(): data: a list has no state_dict(); rng: the name is the kit's own"
    )
    assert one_line("values.yaml: 2 invalid value(s)\n  - a: x\n  - b: y") == (
        "values.yaml: 2 invalid value(s); a: x; b: y"
    )


def _run(argv: list[str], tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], str | None]:
    """`python ARGV...` in a process of its own as a launcher's worker runs (its error file named); (the
    outcome, the one line the launcher would read from the file, None when nothing was written)."""
    error_file = tmp_path / "error.json"
    base = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "MASTER_PORT", CONFIG_ENV}}
    done = run_python(
        *argv,
        env=base | {"PYTHONPATH": str(REPO), ERROR_FILE_ENV: str(error_file)} | env,
        cwd=tmp_path,
        timeout=120,
    )
    said = json.loads(error_file.read_text())["message"]["message"] if error_file.exists() else None
    return done, said


def test_a_ranks_bad_input_reaches_its_launcher_in_one_line(tmp_path):
    """Each problem of a multi-part UserError, not only its heading `attempt.resume():`."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from nvrx_eks.training import api as kit

            def train(attempt):
                model = torch.nn.Linear(4, 4)
                attempt.resume(model=model, rng=model, data=[1, 2, 3])

            kit.Job().run(train)
            """
        )
    )
    config = {"run_dir": str(tmp_path / "run")}
    done, said = _run([str(script)], tmp_path, **{CONFIG_ENV: json.dumps(config)})
    assert done.returncode == 2, done.stderr[-3000:]
    assert said is not None
    assert "\n" not in said
    assert said.startswith("attempt.resume(): rng: the name is the kit's own checkpoint key"), said
    assert "; data: a list has no state_dict()/load_state_dict()" in said, said
    assert "Traceback" not in done.stderr


_ARGPARSE = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int)
parser.parse_args()
"""
_RAISES = """
import json

def load():
    return json.loads("{not json")

load()
"""


@pytest.mark.parametrize(
    ("entry", "source", "code", "message"),
    [
        (["--module", "no_such_package.train"], None, 2, "entrypoint.module no_such_package.train: "),
        (["--script", "missing.py"], None, 2, "entrypoint.script missing.py: no such file"),
        (
            ["--script", "train.py", "--steps", "x"],
            _ARGPARSE,
            2,
            "train.py exited 2: train.py: error: argument --steps",
        ),
        (["--script", "train.py"], "import no_such_dependency\n", 2, "does not import: ModuleNotFoundError"),
        (["--script", "train.py"], "def broken(:\n", 2, "SyntaxError: invalid syntax"),
        (["--script", "train.py"], _RAISES, 1, "JSONDecodeError: Expecting property name"),
    ],
    ids=["no-module", "no-script", "argparse", "missing-dependency", "syntax", "exception-at-import"],
)
def test_whatever_ends_a_script_early_reaches_its_launcher_in_one_line(
    tmp_path, entry, source, code, message
):
    """Before the kit's fix, the launcher read nothing here and said torch's "To enable traceback"."""
    if source is not None:
        (tmp_path / "train.py").write_text(textwrap.dedent(source))
    done, said = _run([entry_script(), *entry], tmp_path)
    assert done.returncode == code, done.stderr[-3000:]
    assert said is not None, done.stderr[-3000:]
    assert message in said, said
    assert "\n" not in said
    if code == 1:  # a failure for the launcher to retry: where it was raised, in the user's own code
        assert "(train.py:5 in load)" in said, said


def test_the_place_of_a_failure_is_the_users_frame_not_the_librarys(tmp_path, monkeypatch):
    """json.loads raises deep in Python's own json package: the place named is the user's call."""
    (tmp_path / "user_code.py").write_text("import json\n\n\ndef parse(text):\n    return json.loads(text)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    from user_code import parse  # noqa: PLC0415

    with pytest.raises(ValueError) as caught:
        parse("{not json")
    assert failures.place(caught.value) == "user_code.py:5 in parse"
    assert failures.describe(caught.value).startswith("JSONDecodeError: Expecting property name")


class _Rank:
    """Rank `rank`'s context as far as judging a failure needs it: its run, its rank, its events."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.record = Record(scope=SimpleNamespace(run_id="run-a"))  # type: ignore[arg-type]
        self.context = SimpleNamespace(
            cfg=api.ResilienceConfig(run_dir=run_dir),
            world=SimpleNamespace(rank=rank),
            events=SimpleNamespace(emit=lambda kind, **fields: None),
        )

    def judge(self, attempt: object, exc: BaseException) -> None:
        process.judge(self.context, self.record, attempt, exc)  # type: ignore[arg-type]


def _fail(step: int) -> ValueError:
    try:
        raise ValueError(f"shapes do not match at {step}")  # noqa: TRY301 - a traceback like a real one
    except ValueError as exc:
        return exc


def test_every_rank_failing_alike_in_one_attempt_is_retried_and_a_repeat_is_a_bug(tmp_path):
    """All data-parallel ranks run the same step: the same exception on two ranks in one attempt is one
    failure (a fault may hit them all), retried; the same rank failing the same way in its next attempt
    is the bug. Before, rank 0 read rank 1's record of that same attempt and ended the job at once."""
    rank_0, rank_1 = _Rank(tmp_path, 0), _Rank(tmp_path, 1)
    in_step = SimpleNamespace(step=7, last_done=6)
    failure = _fail(7)
    rank_1.judge(in_step, failure)  # attempt 0, rank 1
    rank_0.judge(in_step, failure)  # attempt 0, rank 0: the same failure, the same attempt: retried
    with pytest.raises(api.UserCodeError) as bug:
        rank_0.judge(in_step, failure)  # attempt 1, rank 0: again
    message = str(bug.value)
    assert "\n" not in message
    assert message.startswith(
        "the training script failed the same way twice on rank 0 at step 7: ValueError"
    ), message
    assert "test_user_failures.py:" in message  # its place: the user's frame
    assert "Traceback" in bug.value.details
    # Another run of the same folder starts with a clean history: its first failure is retried.
    rank_0.record.scope = SimpleNamespace(run_id="run-b")  # type: ignore[assignment]
    rank_0.judge(in_step, failure)


def test_a_repeat_raised_inside_the_kit_says_so_and_where(tmp_path):
    """A failure whose innermost frame is the kit's (a broken launcher socket under the script's
    `attempt.resume`) was called the script's bug outright; the message names the kit's frame beside
    the script's, so the reader can tell which of the two to look at."""
    rank = _Rank(tmp_path, 0)
    in_step = SimpleNamespace(step=3, last_done=2)
    try:
        failures.signature(None, step=3)  # type: ignore[arg-type]  # a kit function failing
    except AttributeError as exc:
        failure = exc
    rank.judge(in_step, failure)
    with pytest.raises(api.UserCodeError) as bug:
        rank.judge(in_step, failure)
    message = str(bug.value)
    assert (
        "test_user_failures.py:" in message.split("raised inside", maxsplit=1)[0]
    )  # the script's frame, as ever
    assert "raised inside the kit at training/failures.py:" in message, message
    assert (
        "in signature; nothing is retried: if the script's call there is right, it is the kit's bug"
        in message
    )
    # A failure in the script's own code says nothing of the kit.
    assert failures.kit_place(_fail(3)) is None


def test_a_fault_the_launcher_restarts_for_is_named_with_its_place(tmp_path):
    """An exception out of `train` with no in-process layer (mode baseline): the rank exits 1 for its
    launcher to restart, which names the exception and where the user's code raised it."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from nvrx_eks.training import api as kit

            def train(attempt):
                model = torch.nn.Linear(4, 4)
                attempt.resume(model=model)
                for step in attempt.steps(5):
                    raise RuntimeError("CUDA error: an illegal memory access was encountered")

            kit.Job().run(train)
            """
        )
    )
    config = {"run_dir": str(tmp_path / "run")}
    done, said = _run([str(script)], tmp_path, **{CONFIG_ENV: json.dumps(config)})
    assert done.returncode == 1, done.stderr[-3000:]
    assert said == "RuntimeError: CUDA error: an illegal memory access was encountered (train.py:9 in train)"
