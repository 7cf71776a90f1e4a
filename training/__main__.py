"""`python -m nvrx_eks.training`: parse, build, run (the loop itself is training/trainer.py).

Its own flags are its own knobs (training/config.py); the kit's section arrives as for any script, in
`NVRX_EKS_CONFIG`, read by `kit.Job()`."""

from __future__ import annotations

import sys

from nvrx_eks.kitcore.configio import exit_on_user_error
from nvrx_eks.training.config import parse_args


def main(argv: list[str] | None = None) -> int:
    with exit_on_user_error():
        cfg = parse_args(sys.argv[1:] if argv is None else argv)
    # torch loads only once the config is valid: a bad flag is answered at once.
    from nvrx_eks.training import api as kit  # noqa: PLC0415
    from nvrx_eks.training.trainer import ReferenceTrainer  # noqa: PLC0415

    trainer = ReferenceTrainer(cfg)
    job = kit.Job(
        input_checks=[trainer.input_problems],
        tokens_per_step=trainer.tokens_per_step,
        meta={"model": cfg.model},
    )
    job.run(trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
