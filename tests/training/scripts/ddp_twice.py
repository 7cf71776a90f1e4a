"""One DDP training script, run two ways: plain torchrun (`plain`) and under the kit with its own DDP
(`kit`, the documented diff). Each prints the final parameters' sha256 the same way (rank 0)."""

from __future__ import annotations

import gc
import hashlib
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 12


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(8, 32, generator=torch.Generator().manual_seed(1000 * step + rank))


def sha256(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def plain() -> None:
    dist.init_process_group("gloo")
    model = build()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        ddp(batch(step, dist.get_rank())).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    if dist.get_rank() == 0:
        print("sha256", sha256(model), flush=True)
    # DDP's reducer holds the default group and frees it only when collected: destroyed at interpreter
    # exit instead, gloo's threads abort the process (std::terminate) about one run in two at 4 ranks.
    del ddp
    gc.collect()
    dist.destroy_process_group()


def kit() -> None:
    from nvrx_eks.training import api as kit  # noqa: PLC0415

    def train(attempt: kit.Attempt) -> None:
        model = build()
        ddp = DistributedDataParallel(model, process_group=attempt.group)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        attempt.resume(model=model, optimizer=optimizer)
        for step in attempt.steps(STEPS):
            ddp(batch(step, attempt.rank)).pow(2).mean().backward()
            with attempt.update(clip_grad_norm=1.0):
                optimizer.step()
        if attempt.rank == 0:
            print("sha256", sha256(model), flush=True)

    kit.Job().run(train)


if __name__ == "__main__":
    {"plain": plain, "kit": kit}[sys.argv[1]]()
