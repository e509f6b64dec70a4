"""A small nanoGPT-shaped DDP training script: a character-level transformer on synthetic text.

Runs on CPU with the gloo backend. Launch one process per rank with torchrun, or with
trainguard, which takes the same flags and sets the same environment:

    torchrun --nproc-per-node 2 examples/train_ddp.py --steps 200
    trainguard run --nproc-per-node 2 --max-restarts 3 examples/train_ddp.py --steps 200

(--max-restarts: trainguard restarts nothing without a restart budget, as torchrun;
--scenario single-node sets one too.)

It checkpoints every --ckpt-every steps with trainguard's checkpoint library and resumes
from the newest valid checkpoint on start, and calls trainguard's fault injection after each
step (set TRAINGUARD_FAULT to crash it).

Knobs for hang-detection tests and demos (all off by default): --progress reports each step
with trainguard.progress() (and marks slow saves as a phase), --quiet prints no step lines,
--step-time/--step-jitter/--ckpt-pause shape the timing, and --loader-workers N makes the
batches in DataLoader worker processes (where the `loaderhang` fault strikes).
"""

import argparse
import collections
import contextlib
import functools
import hashlib
import math
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import trainguard
from trainguard.checkpoint import Checkpointer
from trainguard.testing.faults import (  # no-ops unless TRAINGUARD_FAULT
    inject,
    inject_loader,
    inject_step,
)
from trainguard.worker.step import StepGuard

# -----------------------------------------------------------------------------
# knobs
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=200, help="total optimizer steps")
parser.add_argument("--batch-size", type=int, default=32, help="sequences per rank per step")
parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
parser.add_argument("--ckpt-every", type=int, default=10, help="save a checkpoint every N steps")
parser.add_argument(
    "--ckpt-dir",
    default=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "./checkpoints"),
    help="checkpoint directory (default: $TRAINGUARD_CHECKPOINT_DIR, else ./checkpoints)",
)
parser.add_argument("--seed", type=int, default=1337, help="seed for the data and the model")
parser.add_argument("--step-time", type=float, default=0.0,
                    help="base sleep per step (s): slower, steady steps")
parser.add_argument("--step-jitter", type=float, default=0.0, metavar="X",
                    help="each step also sleeps a random extra of up to X times --step-time "
                    "(10 ms without it), seeded by --seed, rank and step: reproducible")
parser.add_argument("--ckpt-pause", type=float, default=0.0, metavar="X",
                    help="each checkpoint save also pauses X times the median time of the last 100 "
                    "steps (a slow save); inside trainguard.phase('checkpoint') with --progress")
parser.add_argument("--progress", action="store_true",
                    help="call trainguard.progress(step) every step")
parser.add_argument("--quiet", action="store_true",
                    help="no step lines: print only the start and end summary")
parser.add_argument("--rank0-only", action="store_true",
                    help="step lines on rank 0 only, as most DDP scripts print them")
parser.add_argument("--eval-every", type=int, default=0, metavar="N",
                    help="every N steps, an evaluation marked with trainguard.phase('eval')")
parser.add_argument("--eval-s", type=float, default=1.0, metavar="S",
                    help="how long each --eval-every evaluation takes (it sleeps)")
parser.add_argument("--loader-workers", type=int, default=0, metavar="N",
                    help="make the batches in a torch DataLoader with N worker processes "
                    "(0: in the training loop)")
parser.add_argument("--resilient", action="store_true",
                    help="run the training in trainguard.run_resilient: when a peer rank dies "
                    "or hangs, this process re-enters it in place (in-process restart)")
parser.add_argument("--digest", action="store_true",
                    help="rank 0 prints a SHA-256 of the final weights (exactness checks)")
parser.add_argument("--fixed-buckets", action="store_true",
                    help="DDP keeps its first gradient bucket layout (find_unused_parameters): "
                    "with 3 or more ranks a resumed run then sums gradients in the same order "
                    "as an uninterrupted one, so its weights match bit for bit")
parser.add_argument("--digest-log", metavar="DIR", default="",
                    help="every rank appends a SHA-256 of its weights to DIR/rank-R.txt at its "
                    "start (the resumed step) and after every step (the chaos run's check)")
args = parser.parse_args()
# model: 2 layers, 4 heads, d_model 64, context 32, vocabulary a..z
vocab, block_size, n_layer, n_head, d_model = 26, 32, 2, 4, 64
warmup_steps = 10

# -----------------------------------------------------------------------------
# distributed setup: torchrun-style environment, gloo on CPU
rank = int(os.environ.get("RANK", "0"))
world_size = int(os.environ.get("WORLD_SIZE", "1"))
local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # would pick the GPU; unused on CPU
ddp = world_size > 1
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))  # tiny model: 1 is fastest

# -----------------------------------------------------------------------------
# data: a synthetic character language. A seed-derived lexicon of short "words"; each
# sequence repeats one word, so once the model has seen a word it can predict the rest.
gen = torch.Generator().manual_seed(args.seed)
lengths = torch.randint(3, 9, (64,), generator=gen).tolist()
words = [torch.randint(vocab, (n,), generator=gen) for n in lengths]


def get_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of this rank at this step: a pure function of (seed, step, rank)."""
    g = torch.Generator().manual_seed((args.seed * 1_000_003 + step) * 10_000 + rank)
    rows = []
    for _ in range(args.batch_size):
        word = words[int(torch.randint(len(words), (1,), generator=g))]
        offset = int(torch.randint(len(word), (1,), generator=g))  # start mid-word
        reps = (offset + block_size + 1) // len(word) + 1
        rows.append(word.repeat(reps)[offset : offset + block_size + 1])
    data = torch.stack(rows)
    return data[:, :-1], data[:, 1:]


class StepBatches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Item `step` is the whole batch of that step (for a DataLoader with batch_size=None)."""

    def __len__(self) -> int:
        return int(args.steps) + 1

    def __getitem__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        inject_loader(step)  # TRAINGUARD_FAULT `loaderhang`: this worker blocks forever
        return get_batch(step)


def jitter_s(step: int, base_s: float) -> float:
    """A random extra sleep in [0, --step-jitter * base_s), the same in every run."""
    u = random.Random((args.seed * 1_000_003 + rank) * 1_000_003 + step).random()
    return u * float(args.step_jitter) * base_s


# -----------------------------------------------------------------------------
# model: a minimal GPT (pre-norm blocks, causal self-attention, no dropout)
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(block_size, d_model)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))


def lr_lambda(step: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak (a multiplier of --lr)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, args.steps - warmup_steps))
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))


def weights_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def log_digest(kind: str, step: int, model: nn.Module) -> None:
    """--digest-log: one line `TIME PID KIND STEP SHA256` (kind: start or step)."""
    if args.digest_log:
        with open(os.path.join(args.digest_log, f"rank-{rank}.txt"), "a") as f:
            f.write(f"{time.time():.3f} {os.getpid()} {kind} {step} {weights_sha256(model)}\n")


def main() -> None:
    """Build, resume from the newest checkpoint and train: re-entrant (--resilient runs it
    in trainguard.run_resilient, which calls it again in place after a peer's death)."""
    if ddp:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)  # MASTER_ADDR/PORT
    torch.manual_seed(args.seed)  # same initial weights on every rank
    random.seed(args.seed)

    # -----------------------------------------------------------------------------
    # model, optimizer, schedule, and resuming: trainguard's checkpoints are atomic, validated
    # (manifest + checksums), written in the background, and restore the RNG states too
    model = GPT()
    # DDP when distributed; under `trainguard run --operator-reexecution` a step that fails
    # with a transient collective error is re-executed in these processes (rung 0)
    guard = StepGuard(model, **({"find_unused_parameters": True} if args.fixed_buckets else {}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    ckpt = Checkpointer(args.ckpt_dir, every_steps=args.ckpt_every)
    start_step = ckpt.load_latest(state) or 0  # the newest valid checkpoint, loaded in place
    log_digest("start", start_step, model)
    # trainguard tells each process how often it was started and how often its rank was
    # placed on a node (a script can skip one-time setup on a process restart)
    starts = os.environ.get("TRAINGUARD_PROCESS_START_COUNT", "1")
    print(f"rank {rank}/{world_size}: process start {starts}, scheduled "
          f"{os.environ.get('TRAINGUARD_SCHEDULE_COUNT', '1')}", flush=True)
    if start_step:
        print(f"resumed from step {start_step}", flush=True)
    if args.quiet and rank == 0:
        print(f"training steps {start_step + 1}..{args.steps}, no step lines", flush=True)
    batches = None  # --loader-workers: the batches come from DataLoader worker processes
    if args.loader_workers > 0:
        steps_left = range(start_step + 1, args.steps + 1)
        batches = iter(DataLoader(StepBatches(), batch_size=None, sampler=steps_left,
                                  num_workers=args.loader_workers))

    def train_step(step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one step; a StepGuard may re-run it with the same batch."""
        inject_step(step)  # TRAINGUARD_FAULT `collective`: a transient collective failure
        loss = guard.model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces (averages) the gradients across ranks here
        return loss

    # -----------------------------------------------------------------------------
    # training loop: steps are numbered from 1; `step` is also the number of steps done
    loss_value = float("nan")
    step_times: collections.deque[float] = collections.deque(maxlen=100)  # for --ckpt-pause
    for step in range(start_step + 1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = next(batches) if batches is not None else get_batch(step)
        loss = guard.run(step, functools.partial(train_step, step, x, y))  # every rank agreed
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        if args.step_time > 0:
            time.sleep(args.step_time)  # pretend to be a bigger model
        loss_value = loss.item()
        if args.step_jitter > 0:
            # an uneven step; scaled by a fixed base: a measured step time would include the
            # wait for the other ranks' jitter, and the extras would feed on each other
            time.sleep(jitter_s(step, args.step_time if args.step_time > 0 else 0.01))
        dt = time.perf_counter() - t0
        step_times.append(dt)
        if not args.quiet and (rank == 0 or not args.rank0_only):
            print(f"step {step} loss {loss_value:.4f} lr {lr:.2e} dt {dt * 1000:.1f}ms",
                  flush=True)
        log_digest("step", step, model)
        if rank == 0 and (step % 10 == 0 or step == args.steps):  # as a logger would
            trainguard.log_metrics(step, loss=loss_value, learning_rate=lr)  # `status` shows it
        if args.progress:
            trainguard.progress(step)  # hang detection: this rank is still moving

        saving = step == args.steps or (args.ckpt_every > 0 and step % args.ckpt_every == 0)
        in_phase = saving and args.progress  # a slow save is slow on purpose: its own allowance
        with trainguard.phase("checkpoint") if in_phase else contextlib.nullcontext():
            if saving and args.ckpt_pause > 0:
                time.sleep(args.ckpt_pause * statistics.median(step_times))  # a slow save
            if step == args.steps:
                ckpt.save(step, state)  # the final state, whatever --ckpt-every says
            else:
                ckpt.maybe_save(step, state)  # every --ckpt-every steps; goes on at once
        if args.eval_every > 0 and step % args.eval_every == 0:
            with trainguard.phase("eval"):  # its own hang allowance; no step while it runs
                time.sleep(args.eval_s)
        inject(step)  # TRAINGUARD_FAULT: crash, exit, signal, hang... at this step

    ckpt.close()  # wait until the last save is durable
    guard.close()  # the DDP wrapper goes now, while the process group is still registered
    if args.digest and rank == 0:
        print(f"weights sha256 {weights_sha256(model)}", flush=True)
    if rank == 0 and start_step >= args.steps:
        print(f"done: already at step {start_step}, nothing to train", flush=True)
    elif rank == 0:
        print(f"done: {args.steps} steps, final loss {loss_value:.4f}", flush=True)
    if ddp:
        dist.barrier()  # nobody tears gloo down while a peer still talks to it
        dist.destroy_process_group()


if args.resilient:
    trainguard.run_resilient(main)  # a peer's death or hang: re-entered in this process
else:
    main()
