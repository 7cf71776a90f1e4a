"""`python -m training`: parse, build, run, close (the loop itself is training/trainer.py)."""

from __future__ import annotations

import faulthandler
import logging
import sys

from kitcore.configio import exit_on_user_error
from training.config import parse_args
from training.inputs import check_runtime_inputs


def main(argv: list[str] | None = None) -> int:
    with exit_on_user_error():
        cfg = parse_args(sys.argv[1:] if argv is None else argv)
        check_runtime_inputs(cfg)  # files and launcher variables: before anything is started
    # A worker killed by a signal (SIGSEGV, SIGABRT, the watchdog's SIGKILL excepted) leaves its Python
    # stacks in the launcher's log: the only trace a crash below Python gives.
    faulthandler.enable(all_threads=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from training.run import run  # noqa: PLC0415 - torch and NVRx load only after the config is valid

    with exit_on_user_error():
        run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
