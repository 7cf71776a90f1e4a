"""`python -m training.loop`: this project's training loop, with the kit's resilience.

Its modules share names with the kit's trainer (`training.data`, `training.model`): the kit's are
`nvrx_eks.training.*`, so each import below finds this project's own.
"""

from __future__ import annotations

import argparse

import torch

from nvrx_eks.training import api as kit
from training.data import Batches
from training.model import build


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="An MLP regressor on a teacher's outputs.")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def train(attempt: kit.Attempt, args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    model = build(args.features, args.hidden)
    wrapped = attempt.data_parallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    batches = Batches(
        features=args.features,
        batch_size=args.batch_size,
        rank=attempt.rank,
        world_size=attempt.world_size,
        seed=args.seed,
    )
    attempt.resume(model=model, optimizer=optimizer, data=batches)
    for _ in attempt.steps(args.steps):
        inputs, targets = batches.next()
        loss = torch.nn.functional.mse_loss(wrapped(inputs), targets)
        loss.backward()
        with attempt.update(loss=loss):
            optimizer.step()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    kit.Job().run(lambda attempt: train(attempt, args))


if __name__ == "__main__":
    main()
