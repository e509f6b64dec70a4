"""Throughput of `trainguard diagnose` on big generated multi-rank logs, beside I/O floors.

The logs are generated (and cached by size under --dir): one attempt dir of a trainguard job,
`logs/attempt-0/rank-0.log` .. `rank-7.log`, every line in trainguard's stamped format
`<ISO time> <out|err> <text>`. The noise is what a real run prints: per-step training lines,
tqdm bars, DeepSpeed `log_dist` lines, NCCL INFO lines, Python warnings, eval metrics, a few
KB of JSON config now and then, and words that fool a naive grep (`eval_error_rate`,
`timeout=1800s`, "no errors found"), and lines that name an exception type in passing
(`raised UnicodeDecodeError ..., replaced with padding`, about 38,000 a GiB): the RE2
prefilter hits those, so the Python side has real work, and finds nothing in them. The
sets are written by one process per CPU, 4 MiB at a time (1 GiB in ~15 s here) and kept
for the next run. One real failure is buried ~70% of the way through
rank 5: a traceback ending in `torch.OutOfMemoryError: CUDA out of memory`; the other ranks
print NCCL watchdog timeouts ten minutes later. The files go on after the failure (as if the
noise continued), so the failure sits mid-file, not at the tail.

Measured side by side, in a new random order every repeat, page cache warm:

* `diagnose_paths([attempt dir])`, what `trainguard diagnose DIR` runs; every run's verdict
  must be gpu_oom, culprit rank 5, evidence the exception line of rank-5.log (else it fails);
  its peak RSS (VmHWM, reset before each run) and the process's ru_maxrss after the 1 GiB runs;
* `trainguard diagnose --json DIR` in a new process (start-up included), checked the same way;
* the RE2 prefilter alone (the scanner's first stage: `finditer` over 8 MiB chunks);
* floors: reading the files in 8 MiB chunks, `grep -E -c 'Error|error'` (LC_ALL=C), and a
  plain Python `for line in f` loop (binary, no regex).

Then, on the --rules-size set, diagnose with the shipped rules duplicated x1, x2, x4, x8
(every rule copied under a new id, after the originals, so verdicts do not change), with the
RE2 prefilter of each rule set timed alone beside it. Copies have the same patterns as the
originals, so RE2's share is a lower bound for as many distinct rules; the Python share
(every rule tried on every hit line that matches none) is not. --profile prints a cProfile
of one diagnose of that set (automatic when the 1 GiB target is missed).

    .venv/bin/python benchmarks/diagnosis_throughput.py [--sizes 128,256,512,1024]
        [--rules-size 256] [--rule-factors 1,2,4,8] [--repeats 3] [--quick] [--profile]
        [--dir /tmp/trainguard-diag-throughput] [--regenerate]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import platform
import pstats
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata, resources
from pathlib import Path

import yaml
from _common import BenchError, Spread, load_note, markdown_table, trainguard_exe

from trainguard.diagnosis.prefilter import compile_trigger, prefilter_source
from trainguard.diagnosis.rules import RuleSet, load_rules, parse_rules
from trainguard.diagnosis.sources import default_trigger, diagnose_paths
from trainguard.diagnosis.taxonomy import Category

MIB = 1 << 20
RANKS = 8
OOM_RANK = 5
OOM_AT = 0.70  # fraction of rank 5's bytes before the failure
GEN_VERSION = 4  # bump when the generator changes: cached sets of other versions are redone
BLOCK = 4 * MIB  # the generator writes blocks of about this many bytes
CHUNK = 8 * MIB  # read size of the floors (the scanner's own chunk size)
DEFAULT_DIR = Path("/tmp/trainguard-diag-throughput")
T0 = datetime(2025, 3, 19, 6, 0, tzinfo=timezone.utc).timestamp()
STEP_S = 0.85  # seconds per training step
HOST = "gpu-node-07"
TOTAL_STEPS = 2_000_000
START_STEP = 1000
WATCHDOG_AFTER_S = 600.06  # the collective's timeout (600000 ms) plus a little


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} {load_note()}] {msg}", file=sys.stderr, flush=True)


# -- the logs ----------------------------------------------------------------------------------


_MINUTES: dict[int, str] = {}


def iso(t: float) -> str:
    """trainguard's stamp: ISO-8601, microseconds, +00:00 (the minute's text cached)."""
    us = round(t * 1e6)
    sec, us = divmod(us, 1_000_000)
    minute, sec = divmod(sec, 60)
    head = _MINUTES.get(minute)
    if head is None:
        head = datetime.fromtimestamp(minute * 60, timezone.utc).strftime("%Y-%m-%dT%H:%M:")
        _MINUTES[minute] = head
    return f"{head}{sec:02d}.{us:06d}+00:00"


def py_logging_time(stamp: str) -> str:
    """`2025-03-19 06:00:00,123` (Python logging's asctime) from an ISO stamp."""
    return f"{stamp[:10]} {stamp[11:19]},{stamp[20:23]}"


def hms(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


BARS = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"]


def tqdm_bar(frac: float, width: int = 10) -> str:
    eighths = int(frac * width * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + (BARS[part] if full < width else "")
    return bar.ljust(width)


def config_json(rank: int) -> str:
    """A few KB of one-line JSON: the kind of config dump trainers print (HF + DeepSpeed)."""
    cfg: dict[str, object] = {
        "model_name_or_path": "/models/llama-2-7b-hf", "output_dir": "/checkpoints/run-42",
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 8,
        "learning_rate": 3e-5, "weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.95,
        "adam_epsilon": 1e-8, "max_grad_norm": 1.0, "num_train_epochs": 3,
        "lr_scheduler_type": "cosine", "warmup_ratio": 0.03, "logging_steps": 10,
        "save_steps": 250, "eval_steps": 100, "bf16": True, "tf32": True,
        "gradient_checkpointing": True, "ddp_timeout": 1800,
        "dist_init": "env://?timeout=1800s", "init_process_group_kwargs": "timeout=1800s",
        "report_error_rate": True, "metric_for_best_model": "eval_error_rate",
        "error_on_nan_loss": False, "skip_errors_in_data": False, "seed": 1234 + rank,
        "dataloader_num_workers": 8, "dataloader_pin_memory": True,
        "local_rank": rank, "world_size": RANKS, "master_addr": "10.0.0.7",
        "master_port": 29500, "hostname": HOST,
        "env": {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "ib0",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_BLOCKING_WAIT": "0",
                "CUDA_DEVICE_MAX_CONNECTIONS": "1", "OMP_NUM_THREADS": "8",
                "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"},
        "deepspeed": {
            "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
            "gradient_clipping": 1.0, "steps_per_print": 10, "wall_clock_breakdown": False,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": 3, "overlap_comm": True,
                                  "contiguous_gradients": True, "reduce_bucket_size": 5e8,
                                  "stage3_prefetch_bucket_size": 4.7e8,
                                  "stage3_param_persistence_threshold": 1e6,
                                  "stage3_max_live_parameters": 1e9,
                                  "stage3_max_reuse_distance": 1e9,
                                  "stage3_gather_16bit_weights_on_model_save": True,
                                  "offload_optimizer": {"device": "none"},
                                  "offload_param": {"device": "none"}},
            "comms_logger": {"enabled": False, "verbose": False, "prof_all": True},
            "flops_profiler": {"enabled": False, "profile_step": 1, "module_depth": -1},
        },
        "data": {"train_files": [f"/data/pile/shard-{i:05d}.jsonl.zst" for i in range(40)],
                 "validation_files": [f"/data/pile/val-{i:05d}.jsonl.zst" for i in range(8)],
                 "max_seq_length": 4096, "packing": True, "tokenizer": "llama-2",
                 "errors": "replace"},
        "model": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 32,
                  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 32000,
                  "torch_dtype": "bfloat16", "attn_implementation": "flash_attention_2"},
    }
    return json.dumps(cfg, sort_keys=True)


def oom_traceback(stamp: str) -> list[str]:
    """Rank 5's death, as torch >= 2.2 prints an uncaught exception on a rank: `[rankN]: `."""
    lib = "/opt/conda/lib/python3.11/site-packages"
    body = [
        "Traceback (most recent call last):",
        '  File "/workspace/llm-train/train.py", line 412, in <module>',
        "    main()",
        '  File "/workspace/llm-train/train.py", line 398, in main',
        "    trainer.train()",
        '  File "/workspace/llm-train/trainer.py", line 231, in train',
        "    loss = self.training_step(batch)",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "/workspace/llm-train/trainer.py", line 187, in training_step',
        "    self.engine.backward(loss)",
        f'  File "{lib}/deepspeed/utils/nvtx.py", line 18, in wrapped_fn',
        "    ret_val = func(*args, **kwargs)",
        "              ^^^^^^^^^^^^^^^^^^^^^",
        f'  File "{lib}/deepspeed/runtime/engine.py", line 2020, in backward',
        "    self.optimizer.backward(loss, retain_graph=retain_graph)",
        f'  File "{lib}/torch/_tensor.py", line 581, in backward',
        "    torch.autograd.backward(",
        f'  File "{lib}/torch/autograd/__init__.py", line 347, in backward',
        "    _engine_run_backward(",
        f'  File "{lib}/torch/autograd/graph.py", line 825, in _engine_run_backward',
        "    return Variable._execution_engine.run_backward(  # Calls into the C++ engine "
        "to run the backward pass",
        "           " + "^" * 48,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a "
        "total capacity of 79.15 GiB of which 1.41 GiB is free. Process 48213 has 77.73 GiB "
        "memory in use. Of the allocated memory 73.90 GiB is allocated by PyTorch, and 2.33 GiB "
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
        "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        "See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    ]
    return [f"{stamp} err [rank{OOM_RANK}]: {t}" for t in body]


def glog_time(t: float) -> str:
    """torch's C++ log time, `321 02:07:08.408271257` (month unpadded, nanoseconds)."""
    dt = datetime.fromtimestamp(t, timezone.utc)
    return f"{dt.month}{dt.day:02d} {dt:%H:%M:%S}.{dt.microsecond:06d}{int(t * 1e9) % 1000:03d}"


def watchdog_lines(rank: int, t: float) -> list[str]:
    """What a healthy rank prints when its allreduce with the dead rank times out."""
    stamp = iso(t)
    glog = glog_time(t)
    return [
        f"{stamp} err [rank{rank}]:[E{glog} ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, "
        "NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 "
        "milliseconds before timing out.",
        f"{stamp} err [rank{rank}]:[E{glog} ProcessGroupNCCL.cpp:1664] [PG ID 0 PG GUID "
        f"0(default_pg) Rank {rank}] Exception (either an error or timeout) detected by "
        "watchdog at work: 1580, last enqueued NCCL work: 1580, last completed NCCL work: 1579.",
    ]


class RankWriter:
    """The log of one rank, step after step, written in blocks of about BLOCK bytes."""

    def __init__(self, path: Path, rank: int, target: int, seed: int) -> None:
        self.path, self.rank, self.target = path, rank, target
        self.rng = random.Random(seed)
        self.fh = path.open("wb")
        self.buf: list[str] = []
        self.buf_bytes = 0
        self.written = 0
        self.lines = 0  # lines written and buffered
        self.pid = 48210 + rank
        self.config = config_json(rank)
        self.nccl_tid = 48900 + 17 * rank

    def add(self, lines: Sequence[str]) -> None:
        self.buf.extend(lines)
        self.lines += len(lines)
        self.buf_bytes += sum(map(len, lines)) + len(lines)
        if self.buf_bytes >= BLOCK:
            self.flush()

    @property
    def size(self) -> int:
        """Bytes written and buffered (ASCII estimate of the buffer: close enough)."""
        return self.written + self.buf_bytes

    def flush(self) -> None:
        if self.buf:
            data = ("\n".join(self.buf) + "\n").encode()
            self.fh.write(data)
            self.written += len(data)
            self.buf, self.buf_bytes = [], 0

    def close(self) -> None:
        self.flush()
        self.fh.close()

    def step(self, k: int, t: float) -> None:
        """Everything one rank prints around training step k (at time t)."""
        r, rng = self.rank, self.rng
        s = iso(t)
        s2 = iso(t + 0.0004 + rng.random() * 0.002)
        loss = 1.6 + 2.2 * math.exp(-k / 40000) + (rng.random() - 0.5) * 0.08
        lr = 3e-5 * (0.5 + 0.5 * math.cos(math.pi * min(k / TOTAL_STEPS, 1.0)))
        tps = 16384 / STEP_S * (0.97 + rng.random() * 0.06)
        gn = 0.35 + rng.random() * 0.5
        frac = k / TOTAL_STEPS
        el = k * STEP_S
        out = [
            f"{s} out [train] step={k} loss={loss:.4f} lr={lr:.3e} tokens/s={tps:.0f} "
            f"grad_norm={gn:.3f} mem_alloc={58.5 + rng.random() * 3:.1f}GiB",
            f"{s2} err Training: {int(frac * 100):3d}%|{tqdm_bar(frac)}| {k}/{TOTAL_STEPS} "
            f"[{hms(el)}<{hms((TOTAL_STEPS - k) * STEP_S)}, {1 / STEP_S:.2f}it/s, "
            f"loss={loss:.3f}]",
        ]
        if k % 10 == 0:
            pl = py_logging_time(s2)
            out += [
                f"{s2} out [{pl}] [INFO] [logging.py:96:log_dist] [Rank {r}] step={k}, "
                f"skipped=0, lr=[{lr:.10e}], mom=[(0.9, 0.95)]",
                f"{s2} out [{pl}] [INFO] [timer.py:260:stop] epoch=0/micro_step={k * 8}/"
                f"global_step={k}, RunningAvgSamplesPerSec={37.5 + rng.random():.4f}, "
                f"CurrSamplesPerSec={36 + rng.random() * 3:.4f}, MemAllocated=23.12GB, "
                f"MaxMemAllocated={61 + rng.random():.2f}GB",
            ]
        if k % 20 == 3:
            pre = f"{s2} out {HOST}:{self.pid}:{self.nccl_tid} [{r}] NCCL INFO"
            nxt, prv = (r + 1) % RANKS, (r - 1) % RANKS
            ch = (k // 20) % 4
            out += [
                f"{pre} Channel {ch:02d}/0 : {r}[{r}] -> {nxt}[{nxt}] via P2P/IPC",
                f"{pre} Channel {ch + 4:02d}/0 : {r}[{r}] -> {prv}[{prv}] via P2P/IPC/read",
                f"{pre} NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
                "[3]mlx5_3:1/IB [RO]; OOB ib0:10.0.0.7<0>",
                f"{pre} Using non-device net plugin version 0",
                f"{pre} ncclCommInitRank comm 0x55d5c8a{r}e0 rank {r} nranks {RANKS} "
                f"cudaDev {r} nvmlDev {r} busId {0x18 + 0x11 * r:x}000 commId "
                f"0x3b1e5a0f2c{k % 997:03d} - Init COMPLETE",
                f"{pre} Connected all rings",
                f"{pre} Connected all trees",
                f"{pre} threadThresholds 8/8/64 | 64/8/64 | 512 | 512",
            ]
        if k % 50 == 7:
            lib = "/opt/conda/lib/python3.11/site-packages"
            if k % 100 == 7:
                out += [
                    f"{s2} err {lib}/torch/utils/checkpoint.py:1399: FutureWarning: "
                    "`torch.cpu.amp.autocast(args...)` is deprecated. Please use "
                    "`torch.amp.autocast('cpu', args...)` instead.",
                    f"{s2} err   with torch.enable_grad(), device_autocast_ctx, "
                    "torch.cpu.amp.autocast(**ctx.cpu_autocast_kwargs):  "
                    "# type: ignore[attr-defined]",
                ]
            else:
                out += [
                    f"{s2} err {lib}/torch/_dynamo/eval_frame.py:632: UserWarning: "
                    "torch.utils.checkpoint: the use_reentrant parameter should be passed "
                    "explicitly. In version 2.5 we will raise an exception if use_reentrant "
                    "is not passed. use_reentrant=False is recommended, but if you need to "
                    "preserve the current default behavior, you can pass use_reentrant=True. "
                    "Refer to docs for more details on the differences between the two "
                    "variants.",
                    f"{s2} err   return fn(*args, **kwargs)",
                ]
        if k % 100 == 50:
            err = 0.17 + rng.random() * 0.02
            out += [
                f"{s2} out {{'eval_loss': {loss + 0.1:.4f}, 'eval_error_rate': {err:.4f}, "
                f"'eval_accuracy': {1 - err:.4f}, 'eval_runtime': {12 + rng.random():.4f}, "
                f"'eval_samples_per_second': {81 + rng.random():.3f}, "
                f"'eval_steps_per_second': 2.54, 'epoch': {3 * frac:.2f}}}",
                f"{s2} out [data] shard {k // 100 % 40:05d} validated: 65536 samples, "
                "no errors found (checksum ok, 0 skipped)",
            ]
        if k % 250 == 0:
            out += [
                f"{s2} out Saving model checkpoint to /checkpoints/run-42/checkpoint-{k}",
                f"{s2} out [{py_logging_time(s2)}] [INFO] [torch_checkpoint_engine.py:21:save]"
                f" [Torch] Saving /checkpoints/run-42/checkpoint-{k}/global_step{k}/"
                f"zero_pp_rank_{r}_mp_rank_00_model_states.pt...",
                f"{s2} out Configuration saved in /checkpoints/run-42/checkpoint-{k}/"
                "config.json",
            ]
        if k % 100 == 77:
            # harmless lines that mention an exception type: the RE2 prefilter hits them, so
            # they reach the Python side, which finds nothing in them
            out.append(
                f"{s2} out [data] step {k}: sample {k % 13} of batch {k % 7} raised "
                "UnicodeDecodeError in the tokenizer, replaced with padding")
        if k % 500 == 123:
            out.append(
                f"{s2} out [data] retrying read of s3://datasets/pile/shard-{k // 100 % 40:05d}"
                ".jsonl.zst after ReadTimeoutError (attempt 1/5)")
        if k % 1000 == 999:
            out.append(
                f"{s2} err /opt/conda/lib/python3.11/site-packages/transformers/"
                "modeling_utils.py:1052: FutureWarning: Passing a tuple of past_key_values is "
                "deprecated and will raise a ValueError in v4.47; use a Cache instead.")
        if k % 200 == 111:
            out.append(
                f"{s2} out [{py_logging_time(s2)}] [WARNING] [stage3.py:2069:step] 1 pytorch "
                "allocator cache flushes since last step. this happens when there is high "
                "memory pressure and is detrimental to performance. if this is happening "
                "frequently consider adjusting settings to reduce memory consumption. If you "
                "are unable to make the cache flushes go away consider adding "
                "get_accelerator().empty_cache() calls in your training loop to ensure that "
                "all ranks flush their caches at the same time")
        if k % 1000 == 500:
            out.append(
                f"{s2} err Token indices sequence length is longer than the specified maximum "
                "sequence length for this model (5120 > 4096). Running this sequence through "
                "the model will result in indexing errors")
        if k % 5000 == 1:
            out += [
                f"{s2} err huggingface/tokenizers: The current process just got forked, after "
                "parallelism has already been used. Disabling parallelism to avoid deadlocks...",
                f"{s2} err [rank{r}]:[W{glog_time(t)} ProcessGroupNCCL.cpp:4115] [PG ID 0 PG "
                f"GUID 0 Rank {r}]  using GPU {r} to perform barrier as devices used by this "
                "process are currently unknown. This can potentially cause a hang if this rank "
                "to GPU mapping is incorrect.",
            ]
        if r == 0 and k % 2000 == 1234:
            # wandb's uploader retrying: flagged by the scanner (a symptom), harmless here
            out += [
                f"{s2} err wandb: Network error (ReadTimeout), entering retry loop.",
                f"{s2} err WARNING:urllib3.connectionpool:Retrying (Retry(total=4, connect=None,"
                " read=None, redirect=None, status=None)) after connection broken by "
                "'ProtocolError('Connection aborted.', ConnectionResetError(104, 'Connection "
                "reset by peer'))': /files/acme/llama-7b/run42/file_stream",
            ]
        if k % 400 == 200:
            out.append(f"{s2} out [config] step={k} resolved config: {self.config}")
        self.add(out)


@dataclass(frozen=True)
class Dataset:
    size_mib: int
    root: Path  # holds meta.json and logs/attempt-0/
    files: list[Path]
    bytes: int
    lines: int
    oom_line: int  # line number of the exception line in rank-5.log
    oom_step: int
    oom_at: float  # where the exception line starts, as a fraction of rank-5.log
    gen_s: float

    @property
    def attempt_dir(self) -> Path:
        return self.root / "logs" / "attempt-0"


def bytes_per_step(rank: int) -> float:
    """What one rank writes per step, averaged over a full cycle of the periodic lines."""
    w = RankWriter(Path(os.devnull), rank, 0, seed=rank)
    n = 10_000
    for k in range(1000, 1000 + n):
        w.step(k, T0 + k * STEP_S)
    w.close()
    return w.written / n


def write_rank(adir: Path, rank: int, target: int, seed: int,
               oom_step: int) -> tuple[int, int, int, int]:
    """Write one rank's log; (rank, lines, line of the OOM's exception line or -1, its byte
    offset or -1). Rank 5 dies after step `oom_step`; the others print their watchdog
    timeouts WATCHDOG_AFTER_S later."""
    w = RankWriter(adir / f"rank-{rank}.log", rank, target, seed)
    oom_t = T0 + oom_step * STEP_S + 0.0013 * OOM_RANK + 0.31
    k = START_STEP
    oom_line = oom_offset = -1
    dumped = False
    while w.size < target:
        t = T0 + k * STEP_S + 0.0013 * rank
        w.step(k, t)
        if rank == OOM_RANK and k == oom_step:
            tb = oom_traceback(iso(oom_t))
            oom_offset = w.size + sum(len(x.encode()) + 1 for x in tb[:-1])
            w.add(tb)
            oom_line = w.lines
        elif rank != OOM_RANK and not dumped and t >= oom_t + WATCHDOG_AFTER_S:
            w.add(watchdog_lines(rank, oom_t + WATCHDOG_AFTER_S + 0.0021 * rank))
            dumped = True
        k += 1
    w.close()
    if (rank == OOM_RANK and oom_line < 0) or (rank != OOM_RANK and not dumped):
        raise BenchError(f"generator: rank {rank} ended before its failure lines (too small?)")
    return rank, w.lines, oom_line, oom_offset


def generate(root: Path, size_mib: int) -> Dataset:
    """Write the eight rank logs, one process per CPU."""
    t_start = time.perf_counter()
    adir = root / "logs" / "attempt-0"
    if root.exists():
        shutil.rmtree(root)
    adir.mkdir(parents=True)
    target = size_mib * MIB // RANKS
    oom_step = START_STEP + round(OOM_AT * target / bytes_per_step(OOM_RANK))
    with ProcessPoolExecutor(max_workers=min(RANKS, os.cpu_count() or 1)) as pool:
        done = list(pool.map(write_rank, [adir] * RANKS, range(RANKS), [target] * RANKS,
                             [size_mib * 100 + r for r in range(RANKS)], [oom_step] * RANKS))
    oom_line, oom_offset = done[OOM_RANK][2], done[OOM_RANK][3]
    files = [adir / f"rank-{r}.log" for r in range(RANKS)]
    oom_at = oom_offset / files[OOM_RANK].stat().st_size
    ds = Dataset(size_mib, root, files, sum(f.stat().st_size for f in files),
                 sum(d[1] for d in done), oom_line, oom_step, oom_at,
                 time.perf_counter() - t_start)
    meta = {"version": GEN_VERSION, "size_mib": size_mib, "bytes": ds.bytes, "lines": ds.lines,
            "oom_line": oom_line, "oom_step": oom_step, "oom_at": oom_at, "gen_s": ds.gen_s,
            "file_bytes": {f.name: f.stat().st_size for f in files}}
    (root / "meta.json").write_text(json.dumps(meta, indent=1))
    return ds


def dataset(base: Path, size_mib: int, regenerate: bool) -> tuple[Dataset, bool]:
    """The cached set of this size if intact, else a new one; (set, cached)."""
    root = base / f"{size_mib}MiB-g{GEN_VERSION}"
    meta_path = root / "meta.json"
    if not regenerate and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        adir = root / "logs" / "attempt-0"
        files = [adir / f"rank-{r}.log" for r in range(RANKS)]
        if all(f.is_file() and f.stat().st_size == meta["file_bytes"].get(f.name)
               for f in files) and sorted(p.name for p in adir.iterdir()) == sorted(
                f.name for f in files):
            return Dataset(size_mib, root, files, meta["bytes"], meta["lines"],
                           meta["oom_line"], meta["oom_step"], meta["oom_at"],
                           meta["gen_s"]), True
    log(f"generating {size_mib} MiB under {root} ...")
    ds = generate(root, size_mib)
    log(f"generated {ds.bytes / MIB:.0f} MiB, {ds.lines:,} lines in {ds.gen_s:.1f} s")
    return ds, False


# -- what is timed -----------------------------------------------------------------------------


def reset_peak_rss() -> bool:
    """Reset VmHWM (Linux >= 4.0) so that the next read is the peak of what follows."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check_verdict(ds: Dataset, rules: RuleSet | None) -> tuple[float, float | None]:
    """Time diagnose_paths on the set; raise unless it names rank 5's OOM. (s, peak RSS)."""
    reset_peak_rss()
    t = time.perf_counter()
    rep = diagnose_paths([ds.attempt_dir], rules=rules)
    dt = time.perf_counter() - t
    peak = peak_rss_mib()
    d = rep.diagnosis
    problems = []
    if rep.problems:
        problems.append(f"problems {rep.problems}")
    if d is None:
        problems.append("no diagnosis at all")
    else:
        if d.category is not Category.GPU_OOM:
            problems.append(f"category {d.category.value}, not gpu_oom")
        if d.culprit_rank != OOM_RANK:
            problems.append(f"culprit rank {d.culprit_rank}, not {OOM_RANK}")
        ev = d.evidence
        if ev is None:
            problems.append("no evidence line")
        elif Path(ev.file).name != f"rank-{OOM_RANK}.log" or ev.line != ds.oom_line:
            problems.append(f"evidence {ev.file}:{ev.line}, not rank-{OOM_RANK}.log:"
                            f"{ds.oom_line}")
    if problems:
        summary = "" if d is None else f" (verdict: {d.summary}; rule {d.rule})"
        raise BenchError(f"diagnose on {ds.size_mib} MiB gave a wrong answer: "
                         f"{'; '.join(problems)}{summary}")
    return dt, peak


def time_cli(ds: Dataset) -> float:
    """`trainguard diagnose --json DIR` in a new process (imports, rules, scan, print)."""
    t = time.perf_counter()
    p = subprocess.run([trainguard_exe(), "diagnose", "--json", str(ds.attempt_dir)],
                       capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t
    try:
        d = json.loads(p.stdout)["diagnosis"]
        got = (d["category"], d["culprit"]["rank"], Path(d["evidence"]["file"]).name,
               d["evidence"]["line"])
    except (ValueError, KeyError, TypeError) as e:
        raise BenchError(f"trainguard diagnose --json on {ds.size_mib} MiB: rc {p.returncode}, "
                         f"unreadable output ({e}): {p.stdout[-300:]} {p.stderr[-500:]}") from e
    want = ("gpu_oom", OOM_RANK, f"rank-{OOM_RANK}.log", ds.oom_line)
    if got != want:
        raise BenchError(f"trainguard diagnose --json on {ds.size_mib} MiB: {got}, not {want}")
    return dt


def time_prefilter(ds: Dataset, trigger: object | None = None) -> tuple[float, int]:
    """The scanner's first stage alone: an RE2 trigger (by default the shipped rules' one,
    the very object diagnose uses, its DFA warm) over 8 MiB chunks (lines cut at chunk ends
    are not carried over: a floor, not the scanner). (s, hits)."""
    trigger = trigger or default_trigger()
    t = time.perf_counter()
    hits = 0
    for f in ds.files:
        with f.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                for _ in trigger.finditer(chunk):  # type: ignore[attr-defined]
                    hits += 1
    return time.perf_counter() - t, hits


def engine_comparison(ds: Dataset, mib: int = 8) -> tuple[float, float, int, int]:
    """The prefilter's regex compiled by Python's `re` and by RE2, over the same first
    `mib` MiB of rank 0 (why trainguard depends on google-re2): (re s, RE2 s, hits each)."""
    with ds.files[0].open("rb") as fh:
        data = fh.read(mib << 20)
    source = prefilter_source(load_rules()).encode()
    py = re.compile(source)
    t = time.perf_counter()
    py_hits = sum(1 for _ in py.finditer(data))
    py_s = time.perf_counter() - t
    fast = default_trigger()
    fast.search(data)  # warm its DFA
    t = time.perf_counter()
    re2_hits = sum(1 for _ in fast.finditer(data))
    return py_s, time.perf_counter() - t, py_hits, re2_hits


def time_read(ds: Dataset) -> float:
    buf = bytearray(CHUNK)
    t = time.perf_counter()
    for f in ds.files:
        with f.open("rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return time.perf_counter() - t


def time_grep(ds: Dataset) -> tuple[float, int]:
    env = {**os.environ, "LC_ALL": "C"}
    t = time.perf_counter()
    p = subprocess.run(["grep", "-E", "-c", "Error|error", *map(str, ds.files)],
                       capture_output=True, text=True, env=env, check=False)
    dt = time.perf_counter() - t
    if p.returncode not in (0, 1):
        raise BenchError(f"grep failed ({p.returncode}): {p.stderr.strip()}")
    return dt, sum(int(line.rsplit(":", 1)[1]) for line in p.stdout.splitlines())


def time_lines(ds: Dataset) -> tuple[float, int]:
    t = time.perf_counter()
    n = 0
    for f in ds.files:
        with f.open("rb") as fh:
            for _line in fh:
                n += 1
    return time.perf_counter() - t, n


def warm(ds: Dataset) -> None:
    """Read the set once so that every measurement finds it in the page cache."""
    time_read(ds)


# -- rule sets ---------------------------------------------------------------------------------


def shipped_rules_data() -> dict[str, object]:
    text = resources.files("trainguard.diagnosis").joinpath("rules.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise BenchError("rules.yaml is not a mapping")
    return data


def multiplied_rules(factor: int) -> tuple[RuleSet, float]:
    """The shipped rules, then factor-1 copies of each under ids `<id>-x<j>`; (set, parse s).

    Each copy is a different signature: its pattern is the original's with an alternative
    word of its own (`tgbench<j>x<i>`, found nowhere), so the prefilter and the rule set
    really grow (identical copies would cost RE2 nothing) while the hits stay realistic.
    """
    data = shipped_rules_data()
    rules = list(data["rules"])  # type: ignore[call-overload]
    out = list(rules)
    for j in range(2, factor + 1):
        out += [{**r, "id": f"{r['id']}-x{j}",
                 "pattern": f"(?:{r['pattern']})|tgbench{j}x{i}\\b"}
                for i, r in enumerate(rules)]
    text = yaml.safe_dump({**data, "rules": out}, sort_keys=False, allow_unicode=True)
    t = time.perf_counter()
    rs = parse_rules(text, f"rules x{factor}")
    return rs, time.perf_counter() - t


# -- reporting ---------------------------------------------------------------------------------


def fmt_s(sp: Spread) -> str:
    if sp.hi - sp.lo < 0.005:
        return f"{sp.median:.2f}"
    return f"{sp.median:.2f} ({sp.lo:.2f}-{sp.hi:.2f})"


def rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / MIB / seconds:,.0f}"


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; (a, b, r²)."""
    if len(xs) < 2:
        return ys[0] if ys else 0.0, 0.0, 1.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return a, b, 1.0 - ss_res / ss_tot if ss_tot else 1.0


def machine() -> str:
    try:
        re2_version = metadata.version("google-re2")
    except metadata.PackageNotFoundError:
        re2_version = "?"
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / (1 << 20):.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (f"machine: {os.cpu_count()} logical CPUs, {platform.machine()}{mem}, Linux "
            f"{platform.release()}; Python {platform.python_version()}, google-re2 "
            f"{re2_version}; files in the page cache (warm), one process, one thread")


def profile(ds: Dataset, top: int = 18) -> str:
    prof = cProfile.Profile()
    prof.enable()
    diagnose_paths([ds.attempt_dir])
    prof.disable()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime")
    st.print_stats(top)
    return out.getvalue()


# -- main --------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text}") from e
    if not vals or min(vals) <= 0:
        raise argparse.ArgumentTypeError(f"need positive integers: {text}")
    return vals


def repeat_measures(repeats: int, seed: int,
                    measures: dict[str, Callable[[], None]]) -> None:
    """Run every measure `repeats` times, in a new random order each round."""
    rng = random.Random(seed)
    for _ in range(repeats):
        order = list(measures)
        rng.shuffle(order)
        for name in order:
            measures[name]()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int_list, default=[128, 256, 512, 1024],
                    help="total sizes of the generated sets, MiB (comma-separated)")
    ap.add_argument("--rules-size", type=int, default=256,
                    help="the set (MiB) on which the rule-count scaling is measured")
    ap.add_argument("--rule-factors", type=int_list, default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--target-s", type=float, default=10.0,
                    help="the target for a 1024 MiB set, seconds")
    ap.add_argument("--quick", action="store_true",
                    help="small run: sizes 16,32 MiB, rules on 16 MiB x1,x2, 1 repeat")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile one diagnose of the --rules-size set (automatic when the "
                         "1024 MiB target is missed)")
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                    help="where generated sets are cached (one subdir per size)")
    ap.add_argument("--regenerate", action="store_true", help="ignore cached sets")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.rules_size, args.rule_factors, args.repeats = [16, 32], 16, [1, 2], 1
    sizes = sorted(set(args.sizes))
    want = sorted({*sizes, args.rules_size})
    need_mib = sum(want)
    args.dir.mkdir(parents=True, exist_ok=True)
    free_mib = shutil.disk_usage(args.dir).free / MIB
    if free_mib < need_mib * 1.1:
        raise BenchError(f"{args.dir}: {free_mib:.0f} MiB free, the sets need ~{need_mib} MiB")

    sets = {}
    gen_rows = []
    for size in want:
        ds, cached = dataset(args.dir, size, args.regenerate)
        sets[size] = ds
        gen_rows.append([f"{size}", f"{ds.bytes / MIB:,.0f}", f"{ds.lines:,}",
                         f"{ds.bytes / ds.lines:.0f}",
                         f"rank-{OOM_RANK}.log:{ds.oom_line:,} ({ds.oom_at:.0%} in, "
                         f"step {ds.oom_step:,})",
                         f"{ds.gen_s:.1f}" + (" (cached)" if cached else "")])

    # the first call in a process parses the rules, compiles the RE2 trigger and builds its
    # DFA as it goes: timed apart, on the smallest set, so that the table is steady state
    rss_before = maxrss_mib()
    first = sets[sizes[0]]
    warm(first)
    cold_s, _ = check_verdict(first, None)
    warm_s, _ = check_verdict(first, None)
    # -- throughput by size
    size_rows = []
    fit_x: list[float] = []
    fit_y: list[float] = []
    peaks: dict[int, float | None] = {}
    hits_by_size: dict[int, tuple[int, int, int]] = {}
    t_1g: float | None = None
    rss_after_1g: float | None = None
    for size in sizes:
        ds = sets[size]
        log(f"{size} MiB: measuring ({args.repeats} repeats) ...")
        warm(ds)
        res: dict[str, list[float]] = {
            k: [] for k in ("diag", "cli", "re2", "read", "grep", "lines")}
        counts: dict[str, int] = {}
        peak: list[float] = []

        def m_diag(ds: Dataset = ds, res: dict[str, list[float]] = res,
                   peak: list[float] = peak) -> None:
            dt, pk = check_verdict(ds, None)
            res["diag"].append(dt)
            if pk is not None:
                peak.append(pk)

        def m_cli(ds: Dataset = ds, res: dict[str, list[float]] = res) -> None:
            res["cli"].append(time_cli(ds))

        def m_re2(ds: Dataset = ds, res: dict[str, list[float]] = res,
                  counts: dict[str, int] = counts) -> None:
            dt, counts["re2"] = time_prefilter(ds)
            res["re2"].append(dt)

        def m_read(ds: Dataset = ds, res: dict[str, list[float]] = res) -> None:
            res["read"].append(time_read(ds))

        def m_grep(ds: Dataset = ds, res: dict[str, list[float]] = res,
                   counts: dict[str, int] = counts) -> None:
            dt, counts["grep"] = time_grep(ds)
            res["grep"].append(dt)

        def m_lines(ds: Dataset = ds, res: dict[str, list[float]] = res,
                    counts: dict[str, int] = counts) -> None:
            dt, counts["lines"] = time_lines(ds)
            res["lines"].append(dt)

        repeat_measures(args.repeats, size, {"diag": m_diag, "cli": m_cli, "re2": m_re2,
                                             "read": m_read, "grep": m_grep, "lines": m_lines})
        sp = {k: Spread.of(v) for k, v in res.items()}
        peaks[size] = max(peak) if peak else None
        hits_by_size[size] = (counts["re2"], counts["grep"], counts["lines"])
        fit_x.append(ds.bytes / (1 << 30))
        fit_y.append(sp["diag"].median)
        size_rows.append([
            f"{size}", fmt_s(sp["diag"]), rate(ds.bytes, sp["diag"].median),
            "?" if peaks[size] is None else f"{peaks[size]:.0f}",
            f"{sp['cli'].median:.2f}",
            f"{sp['re2'].median:.2f} ({rate(ds.bytes, sp['re2'].median)})",
            f"{sp['read'].median:.2f} ({rate(ds.bytes, sp['read'].median)})",
            f"{sp['grep'].median:.2f} ({rate(ds.bytes, sp['grep'].median)})",
            f"{sp['lines'].median:.2f} ({rate(ds.bytes, sp['lines'].median)})",
            f"{sp['diag'].median / sp['read'].median:.1f}x / "
            f"{sp['diag'].median / sp['grep'].median:.1f}x / "
            f"{sp['diag'].median / sp['lines'].median:.2f}x",
        ])
        log(f"{size} MiB: diagnose {sp['diag'].median:.2f} s")
        if size == 1024:
            t_1g = sp["diag"].median
            rss_after_1g = maxrss_mib()

    # -- throughput by rule count
    rule_rows = []
    rds = sets[args.rules_size]
    log(f"rules scaling on {args.rules_size} MiB ...")
    warm(rds)
    rule_x: list[float] = []
    rule_y: list[float] = []
    base_t: float | None = None
    for factor in args.rule_factors:
        rs, parse_s = multiplied_rules(factor)
        t = time.perf_counter()
        trigger = compile_trigger(rs)
        compile_s = time.perf_counter() - t
        time_prefilter(rds, trigger)  # builds its DFA
        re2_s, _ = time_prefilter(rds, trigger)
        times = []
        for _ in range(args.repeats):
            dt, _pk = check_verdict(rds, rs)
            times.append(dt)
        rsp = Spread.of(times)
        base_t = base_t or rsp.median
        rule_x.append(len(rs.rules))
        rule_y.append(rsp.median)
        rule_rows.append([f"x{factor}", f"{len(rs.rules)}", f"{parse_s * 1000:.0f}",
                          f"{compile_s * 1000:.0f}", fmt_s(rsp),
                          rate(rds.bytes, rsp.median), f"{rsp.median / base_t:.2f}",
                          f"{re2_s:.2f}", f"{rsp.median - re2_s:.2f}"])
        log(f"rules x{factor}: {rsp.median:.2f} s")

    # -- report
    print(f"## `trainguard diagnose` throughput ({RANKS} rank logs, one buried gpu_oom)\n")
    print(machine())
    print()
    print("Generated sets (cached under "
          f"`{args.dir}`; lines in trainguard's stamped format):\n")
    print(markdown_table(["MiB", "bytes (MiB)", "lines", "bytes/line", "the buried failure",
                          "generation s"], gen_rows))
    print()
    print(f"Throughput by size: median of {args.repeats} (min-max), seconds; MiB/s in "
          "parentheses. `diagnose`: diagnose_paths([attempt dir]) in this process, steady "
          "state; `CLI`: `trainguard diagnose --json DIR` in a new process (imports, rules, "
          "scan, output). Every run of both checked: gpu_oom, culprit rank 5, evidence the "
          "exception line of rank-5.log.\n")
    print(markdown_table(
        ["MiB", "diagnose s", "diagnose MiB/s", "peak RSS MiB", "CLI s",
         "RE2 prefilter only",
         "read 8 MiB chunks", "grep -E -c", "python `for line`",
         "diagnose time ÷ read, grep, for-line"], size_rows))
    print()
    hits_rows = [[f"{s}", f"{h[0]:,}", f"{h[0] / (sets[s].bytes / (1 << 30)):,.0f}", f"{h[1]:,}",
                  f"{h[2]:,}"] for s, h in hits_by_size.items()]
    print(f"First diagnose in the process ({sizes[0]} MiB; rules parse, RE2 compile, DFA "
          f"warm-up): {cold_s:.2f} s; the next one: {warm_s:.2f} s.\n")
    py_s, re2_s, py_hits, re2_hits = engine_comparison(sets[sizes[0]])
    print(f"The prefilter's regex over the first 8 MiB of rank 0 of the {sizes[0]} MiB set: "
          f"Python's re {py_s:.2f} s ({8 / py_s:.1f} MiB/s, {py_hits} matches), RE2 "
          f"{re2_s:.3f} s ({8 / re2_s:.0f} MiB/s, {re2_hits} matches): "
          f"{py_s / re2_s:.0f}x.\n")
    print("Lines the RE2 prefilter hands to Python (hits), against a naive grep:\n")
    print(markdown_table(["MiB", "RE2 prefilter hits", "hits per GiB",
                          "`grep -E -c 'Error|error'` lines", "lines"], hits_rows))
    print()
    a, b, r2 = fit_line(fit_x, fit_y)
    print(f"Scaling with size: diagnose s ≈ {a:.2f} + {b:.2f} * GiB (least squares over "
          f"{len(fit_x)} sizes, r² = {r2:.4f}).")
    if t_1g is not None:
        verdict = "met" if t_1g < args.target_s else "MISSED"
        print(f"Target for 1 GiB: < {args.target_s:g} s; measured {t_1g:.2f} s: {verdict}.")
        print(f"Memory: process peak RSS (getrusage ru_maxrss) {rss_before:.0f} MiB before the "
              f"first diagnose (imports, the generator's calibration), {rss_after_1g:.0f} MiB "
              "after the 1024 MiB runs; per-run peak "
              f"(VmHWM, reset before each run): {peaks.get(1024) or 0:.0f} MiB at 1024 MiB, "
              f"{peaks.get(sizes[0]) or 0:.0f} MiB at {sizes[0]} MiB.")
    else:
        print(f"Memory: process peak RSS (getrusage ru_maxrss) {rss_before:.0f} MiB before the "
              f"first diagnose, {maxrss_mib():.0f} MiB after the size runs.")
    print()
    print(f"Throughput by number of rules ({args.rules_size} MiB set; every rule duplicated "
          "under new ids after the originals, each with an alternative word of its own; `rules=` "
          "passed, so the call compiles its own "
          "RE2 trigger): median of {} (min-max).\n".format(args.repeats))
    print(markdown_table(["rules", "count", "parse ms", "trigger compile ms", "diagnose s",
                          "MiB/s", "vs x1", "of which RE2 prefilter s (alone, warm)",
                          "the rest s (Python on hit lines, DFA warm-up)"], rule_rows))
    print()
    ra, rb, rr2 = fit_line(rule_x, rule_y)
    print(f"Scaling with rules: diagnose s ≈ {ra:.2f} + {rb * 100:.3f} * (rules/100) "
          f"(r² = {rr2:.4f}).")
    if args.profile or (t_1g is not None and t_1g >= args.target_s):
        print(f"\ncProfile of one diagnose of the {args.rules_size} MiB set (by own time):\n")
        print("```")
        print(profile(rds).rstrip())
        print("```")
    print(f"\n{datetime.now():%Y-%m-%d %H:%M} · .venv/bin/python "
          f"benchmarks/diagnosis_throughput.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
