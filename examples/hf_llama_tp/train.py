"""Train a Hugging Face Llama the way a large job does, under the kit: the script's own 2-D parallelism.

The parallelism is this script's, as in torchtitan: a device mesh of the attempt's ranks, `(dp, tp)`
with its shape from the job values (`trainer.parallel.mesh`); tensor parallelism within a node
(`parallelize_module`: attention and MLP projections column- then row-wise over `tp`), FSDP2 across
nodes (`fully_shard` per decoder layer, then the root, over `dp`) with a mixed-precision policy (bf16
compute, fp32 gradient reduction: `--bf16 auto` uses it where the CPU computes bf16), and gradient
accumulation over micro-batches (`set_requires_gradient_sync`). The kit asks for what it asks of any
script (the lines marked `# kit`): the training in a function, the mesh from the attempt, the state
to `attempt.resume`, `attempt.steps` and `attempt.update`.

The data loader keeps a global position (samples consumed), and each data-parallel rank takes its share
of every global batch: resumed at another world size, no sample is skipped or repeated.

Run it under the local chaos test (2 nodes x 2 ranks: tp=2 within a node, dp=2 across):
`nvrx-eks demo -f k8s/values/local-hf-llama-tp.yaml --skip-synth`.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, cast

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaForCausalLM

from examples.hf_llama.train import MODEL, Corpus, ShardedLoader
from nvrx_eks.training import api as kit  # kit

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

log = logging.getLogger("hf_llama_tp")

TP_PLAN = {
    "self_attn.q_proj": ColwiseParallel(),
    "self_attn.k_proj": ColwiseParallel(),
    "self_attn.v_proj": ColwiseParallel(),
    "self_attn.o_proj": RowwiseParallel(),
    "mlp.gate_proj": ColwiseParallel(),
    "mlp.up_proj": ColwiseParallel(),
    "mlp.down_proj": RowwiseParallel(),
}
"""Each decoder layer's projections, Megatron-style: one all-reduce per attention and per MLP."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A small Llama with tensor parallelism and FSDP2.")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch-size", type=int, default=4, help="samples per data-parallel rank and step")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bf16", choices=["auto", "on", "off"], default="auto")
    return parser.parse_args(argv)


def bf16_computes(device: torch.device) -> bool:
    """Whether this device runs a bf16 matmul (every GPU the kit targets does; most CPUs do)."""
    try:
        ones = torch.ones(4, 4, dtype=torch.bfloat16, device=device)
        return bool(torch.equal((ones @ ones).float(), torch.full((4, 4), 4.0, device=device)))
    except RuntimeError:
        return False


def parallelize(model: LlamaForCausalLM, mesh: DeviceMesh, *, bf16: bool) -> None:
    """Tensor parallelism over `tp`, then FSDP2 over `dp`, in place (the optimizer is built after)."""
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], TP_PLAN)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"], mp_policy=policy or MixedPrecisionPolicy())
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy or MixedPrecisionPolicy())


def train(attempt: kit.Attempt, args: argparse.Namespace) -> None:  # kit: called again after a restart
    mesh = attempt.device_mesh()  # kit: this attempt's ranks, shaped by the job values
    bf16 = args.bf16 == "on" or (args.bf16 == "auto" and bf16_computes(attempt.device))
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(MODEL).to(attempt.device)
    parallelize(model, mesh, bf16=bf16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / args.warmup))
    corpus = Corpus(seed=args.seed, seq_len=32, vocab=MODEL.vocab_size)
    dp = mesh["dp"]  # the tensor-parallel ranks of a group share its batch
    loader = ShardedLoader(
        corpus,
        batch_size=args.batch_size * args.accumulate,
        rank=dp.get_local_rank(),
        world_size=dp.size(),
        seed=args.seed,
    )
    attempt.resume(model=model, optimizer=optimizer, scheduler=scheduler, data=loader)  # kit
    sharded = cast("FSDPModule", model)  # fully_shard made it one
    for step in attempt.steps(args.steps):  # kit: was range(args.steps)
        batch = loader.next_batch()
        step_loss = torch.zeros((), device=attempt.device)
        for micro in range(args.accumulate):
            # FSDP2 reduce-scatters the gradients only after the last micro-batch's backward.
            sharded.set_requires_gradient_sync(micro == args.accumulate - 1)
            part = {key: value.chunk(args.accumulate)[micro] for key, value in batch.items()}
            loss = model(**part).loss / args.accumulate
            loss.backward()
            step_loss += loss.detach()
        with attempt.update(loss=step_loss, clip_grad_norm=1.0):  # kit: clipped over both meshes
            optimizer.step()
            scheduler.step()
        if attempt.rank == 0 and step % 10 == 0:
            log.info("step %d loss %.4f lr %.2e", step, attempt.step_loss, scheduler.get_last_lr()[0])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    kit.Job(meta={"bf16": args.bf16}).run(lambda attempt: train(attempt, args))  # kit


if __name__ == "__main__":
    main()
