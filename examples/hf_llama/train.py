"""Train a Hugging Face Llama on your own data with the kit's resilience: a torchrun script, 12 lines added.

The model is transformers' `LlamaForCausalLM`, built from a small config (no weights are downloaded);
the data pipeline, the optimizer and the LR schedule are this script's own. The lines marked `# kit`
are everything the kit asks of a plain torchrun DDP script (docs/your-script.md shows the diff):

- the training moves into a function the kit calls, and calls again after an in-process restart;
- `attempt.data_parallel(model)` replaces `DistributedDataParallel(model)` (before the optimizer:
  on GPUs it is FSDP2, which replaces the parameters);
- `attempt.resume(...)` takes the state (model, optimizer, scheduler, the loader's position) and
  restores it from the nearest copy: the previous attempt's memory, a partner's RAM, disk, durable;
- `attempt.steps(n)` replaces `range(n)`; `attempt.update()` wraps the optimizer's step;
- `kit.Job().run(train)` replaces `init_process_group()` and the call to the training function.

Run it under the local chaos test (every fault class, a bit-identical verdict):
`nvrx-eks demo -f k8s/values/local-hf-llama.yaml --skip-synth`.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from transformers import LlamaConfig, LlamaForCausalLM

from nvrx_eks.training import api as kit  # kit

log = logging.getLogger("hf_llama")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A small Llama on a synthetic corpus.")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--parallel",
        choices=["kit", "ddp"],
        default="kit",
        help="kit: attempt.data_parallel (exact across restarts on CPU); ddp: the script's own "
        "DistributedDataParallel on the attempt's group (its restarts differ in the last bits)",
    )
    return parser.parse_args(argv)


MODEL = LlamaConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


class Corpus:
    """A token corpus: a noisy affine recurrence per document, the same for a given seed everywhere."""

    def __init__(self, *, seed: int, num_docs: int = 512, seq_len: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (num_docs, 1), generator=generator)
        stride = torch.randint(1, 8, (num_docs, 1), generator=generator)
        noise = (torch.rand(num_docs, seq_len, generator=generator) < 0.1).long()  # noqa: PLR2004
        self.docs = (start + stride * torch.arange(seq_len) + noise) % vocab

    def __len__(self) -> int:
        return len(self.docs)


class ShardedLoader:
    """This rank's batches, reshuffled every epoch; its position is its state (Stateful)."""

    def __init__(self, corpus: Corpus, *, batch_size: int, rank: int, world_size: int, seed: int) -> None:
        self.corpus, self.batch_size, self.rank, self.world_size, self.seed = (
            corpus,
            batch_size,
            rank,
            world_size,
            seed,
        )
        self.epoch, self.position = 0, 0

    def next_batch(self) -> dict[str, torch.Tensor]:
        per_step = self.batch_size * self.world_size
        if self.position + per_step > len(self.corpus):
            self.epoch, self.position = self.epoch + 1, 0
        order = torch.randperm(
            len(self.corpus), generator=torch.Generator().manual_seed(self.seed + self.epoch)
        )
        first = self.position + self.rank * self.batch_size
        tokens = self.corpus.docs[order[first : first + self.batch_size]]
        self.position += per_step
        return {"input_ids": tokens, "labels": tokens}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


def train(attempt: kit.Attempt, args: argparse.Namespace) -> None:  # kit: called again after a restart
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(MODEL)
    if args.parallel == "ddp":  # the script's own parallelism, on this attempt's process group
        ddp: torch.nn.Module = DistributedDataParallel(model, process_group=attempt.group)
    else:
        ddp = attempt.data_parallel(
            model, blocks=model.model.layers
        )  # kit: was DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / args.warmup))
    corpus = Corpus(seed=args.seed, seq_len=args.seq_len, vocab=MODEL.vocab_size)
    loader = ShardedLoader(
        corpus, batch_size=args.batch_size, rank=attempt.rank, world_size=attempt.world_size, seed=args.seed
    )
    attempt.resume(model=model, optimizer=optimizer, scheduler=scheduler, data=loader)  # kit
    for step in attempt.steps(args.steps):  # kit: was range(args.steps)
        loss = ddp(**loader.next_batch()).loss
        loss.backward()
        with attempt.update(loss=loss, clip_grad_norm=1.0):  # kit
            optimizer.step()
            scheduler.step()
        if attempt.rank == 0 and step % 10 == 0:
            log.info("step %d loss %.4f lr %.2e", step, loss.item(), scheduler.get_last_lr()[0])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    kit.Job().run(lambda attempt: train(attempt, args))  # kit: was init_process_group(); train(args)


if __name__ == "__main__":
    main()
