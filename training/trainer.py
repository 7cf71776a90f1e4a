"""The reference trainer: a Llama-style decoder on deterministic data, and the public API's first client.

It imports nothing of the kit but `training.api` (an import contract in the suite says so): every
resilience layer, the tiered checkpointer, the fault injector and the metrics reach it the way they
reach a user's script. What is its own: the model presets, the data keyed by sample index, AdamW and
the scale model of a device step.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812

from nvrx_eks.training.data import DataSource, SyntheticTokens, TokenFile, token_file_problems
from nvrx_eks.training.model import PRESETS, build_model

if TYPE_CHECKING:
    from nvrx_eks.training import api as kit
    from nvrx_eks.training.config import TrainConfig

log = logging.getLogger("training")


def emulate_device_wait(seconds: float) -> None:
    """The host blocked on the device, as in a stream sync: no core held, so the previous snapshot's
    background copy overlaps it as a side-stream D2H copy overlaps GPU compute. In short slices: an
    in-process restart interrupts the main thread with an asynchronous exception, which Python delivers
    between bytecodes; on a GPU the aborted communicator ends a real wait just as promptly."""
    deadline = time.perf_counter() + seconds
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(left, 0.01))


class ReferenceTrainer:
    """`Job().run(ReferenceTrainer(cfg))`: one call per attempt; `cfg` is the trainer's own settings."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.shape = PRESETS[cfg.model]

    def input_problems(self) -> list[str]:
        """The trainer's own runtime input, checked with the kit's before anything starts."""
        path = self.cfg.data.token_file
        return token_file_problems(path, seq_len=self.shape.seq_len) if path is not None else []

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.data.batch_size * self.shape.seq_len

    def __call__(self, attempt: kit.Attempt) -> None:
        cfg = self.cfg
        model = build_model(cfg.model, seed=cfg.seed, device=attempt.device)
        wrapped = attempt.data_parallel(model, blocks=model.layers)  # FSDP2 on CUDA: before the optimizer
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, foreach=False
        )
        attempt.resume(model=model, optimizer=optimizer)
        source: SyntheticTokens | TokenFile
        if cfg.data.token_file is not None:
            source = TokenFile(path=cfg.data.token_file, seq_len=self.shape.seq_len)
        else:
            source = SyntheticTokens(
                seed=cfg.seed, vocab_size=self.shape.vocab_size, seq_len=self.shape.seq_len
            )
        # The data is the job's at its full size; a shrunk job's ranks each take a larger share of the
        # same global batch (DataSource.share), so the training math does not change with the size.
        data = DataSource(source=source, batch_size=cfg.data.batch_size, world_size=attempt.full_world_size)
        for step in attempt.steps(cfg.steps):
            started = time.perf_counter()
            loss = torch.zeros((), device=attempt.device)
            for batch, weight in data.share(step, attempt.rank, attempt.world_size, attempt.device):
                logits = wrapped(batch.inputs)
                micro = F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten()) * weight
                micro.backward()  # FSDP2 (CUDA) reduce-scatters gradients here
                loss = loss + micro.detach()
            if cfg.emulated_device_step_s:
                emulate_device_wait(cfg.emulated_device_step_s)
            with attempt.update(loss=loss, clip_grad_norm=cfg.optim.grad_clip or None):
                optimizer.step()
            if attempt.rank == 0 and (step % cfg.log_every == 0 or step == cfg.steps - 1):
                step_ms = (time.perf_counter() - started) * 1e3
                log.info("step %d/%d loss %.4f (%.1f ms)", step, cfg.steps, attempt.step_loss, step_ms)
