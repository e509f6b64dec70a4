"""py-spy JSON -> threads -> what each rank does -> the culprit, on real dumps (tests/data/hang)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainguard.hang.classify import finalizing
from trainguard.hang.stacks import (
    Frame,
    HangCulprit,
    RankStack,
    ThreadStack,
    classify,
    describe,
    main_thread,
    name_culprit,
    parse_pyspy_json,
    render_text,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "hang"


def sample(name: str, rank: int = 0) -> RankStack:
    text = (DATA / f"{name}.json").read_text(encoding="utf-8")
    return RankStack(rank, json.loads(text)[0]["pid"], tuple(parse_pyspy_json(text)))


def main_of(name: str) -> ThreadStack:
    t = main_thread(sample(name))
    assert t is not None
    return t


def culprit(ranks: dict[int, str], steps: dict[int, int | None] | None = None) -> HangCulprit:
    return name_culprit({r: sample(n, r) for r, n in ranks.items()}, steps or {})


# -- parsing -----------------------------------------------------------------------------

def test_every_sample_parses() -> None:
    names = sorted(p.name.removesuffix(".json") for p in DATA.glob("*.json"))
    assert len(names) >= 20
    for name in names:
        threads = sample(name).threads
        assert threads and all(t.frames for t in threads), name


def test_a_dump_keeps_py_spys_fields_innermost_first() -> None:
    [t] = sample("spin.native").threads
    assert (t.idle, t.owns_gil, t.name) == (False, True, None)
    assert t.os_thread_id == sample("spin.native").pid
    assert [f.name for f in t.frames] == ["spin", "<module>", t.frames[-1].name]
    spin = t.frames[0]
    assert (spin.filename.endswith("/spin.py"), spin.line, spin.module, spin.native) == (
        True, 4, None, False)
    libc = t.frames[-1]
    assert libc.native and libc.module and libc.module.endswith("libc.so.6")


def test_native_frames_are_marked_native() -> None:
    [t] = sample("flock.native").threads
    assert [(f.name, f.native) for f in t.frames[:4]] == [
        ("flock", True), ("fcntl_flock_impl", True), ("fcntl_flock", True), ("take_lock", False)]
    assert t.frames[1].line == 297  # debug info: fcntlmodule.c:297
    [plain] = sample("flock").threads
    assert not any(f.native for f in plain.frames)


def test_parsing_tolerates_missing_keys() -> None:
    [t] = parse_pyspy_json('[{"frames": [{"name": "f"}, {}, 3], "active": "yes"}]')
    assert (t.thread_id, t.name, t.idle, t.owns_gil, t.os_thread_id) == (0, None, None, None,
                                                                          None)
    assert t.frames == (Frame("f", "", 0, None, False), Frame("?", "", 0, None, False))
    assert parse_pyspy_json("[]") == []
    assert parse_pyspy_json('[1, {"thread_id": 7, "frames": null}]') == [
        ThreadStack(7, None, None, None, ())]
    [one] = parse_pyspy_json('{"thread_id": 5, "frames": []}')  # a lone thread object
    assert one.thread_id == 5


@pytest.mark.parametrize("text", ["", "Error: Failed to get process executable name", "[{",
                                  "Process 12: python\nThread 12 (idle)\n    f (x.py:1)"])
def test_non_json_is_a_clear_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not JSON"):
        parse_pyspy_json(text)


def test_json_that_is_not_a_thread_list_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a list of threads"):
        parse_pyspy_json('{"error": "x"}')


# -- the main thread ---------------------------------------------------------------------

def test_the_main_thread_is_the_one_whose_os_id_is_the_pid() -> None:
    rs = sample("dataloader_workers.native")
    assert rs.threads[0].name == "QueueFeederThread"  # py-spy's order is not the main first
    main = main_thread(rs)
    assert main is not None and main.os_thread_id == rs.pid and main.name == "MainThread"


def test_without_os_ids_the_main_thread_is_found_by_name_then_by_module() -> None:
    rs = sample("thread_join.native")
    bare = replace(rs, threads=tuple(replace(t, os_thread_id=None) for t in rs.threads))
    main, by_name = main_thread(rs), main_thread(bare)
    assert main is not None and by_name is not None and main is not rs.threads[0]
    assert by_name.thread_id == main.thread_id
    unnamed = replace(bare, threads=tuple(replace(t, name=None) for t in bare.threads))
    m = main_thread(unnamed)
    assert m is not None and any(f.name == "<module>" for f in m.frames)
    assert main_thread(RankStack(0, 1, ())) is None


# -- classification ----------------------------------------------------------------------

@pytest.mark.parametrize(("name", "kind", "detail"), [
    ("gloo_allreduce_rank0.native", "collective", "all_reduce"),
    ("gloo_allreduce_rank0", "collective", "all_reduce"),
    ("gloo_barrier_rank0.native", "collective", "barrier"),
    ("gloo_barrier_rank0", "collective", "barrier"),
    ("ddp_backward_rank0.native", "collective", "c10d::Reducer::finalize_backward"),
    ("dataloader_workers.native", "dataloader", "_MultiProcessingDataLoaderIter._try_get_data"),
    ("dataloader_workers", "dataloader", "_MultiProcessingDataLoaderIter._try_get_data"),
    ("dataloader_inline.native", "dataloader", "_SingleProcessDataLoaderIter._next_data"),
    ("flock.native", "lock", "fcntl.flock"),
    ("thread_join.native", "lock", "Thread.join"),
    ("thread_join", "lock", "Thread.join"),
    ("sleep.native", "sleep", "time.sleep"),
    ("gloo_sleep_rank1.native", "sleep", "time.sleep"),
    ("pipe_read.native", "io", "read"),
    ("spin.native", "compute", ""),
    ("spin", "compute", ""),
])
def test_classify_real_dumps(name: str, kind: str, detail: str) -> None:
    assert describe(main_of(name)) == (kind, detail)
    assert classify(main_of(name)) == kind


@pytest.mark.parametrize("name", ["sleep", "flock", "gloo_sleep_rank1", "pipe_read"])
def test_without_native_frames_a_blocked_call_is_only_blocked(name: str) -> None:
    """time.sleep, flock and read leave no Python frame of their own."""
    assert classify(main_of(name)) == "blocked"


def test_without_native_frames_ddp_backward_still_waits_in_a_collective() -> None:
    """Walk-through 30: a native dump timed out under load, and the rank waiting for DDP's
    gradient all-reduce read "blocked outside Python code": the hang named no culprit. In
    autograd's backward and not running code, it waits for the all-reduce."""
    assert describe(main_of("ddp_backward_rank0")) == (
        "collective", "autograd backward (DDP's gradient all-reduce)")
    busy = replace(main_of("ddp_backward_rank0"), idle=False)  # computing its gradients
    assert classify(busy) == "compute"
    v = culprit({0: "ddp_backward_rank0", 1: "gloo_sleep_rank1"})
    assert (v.rank, v.by_rank) == (1, {0: "collective", 1: "blocked"})


def test_a_thread_in_a_lock_of_its_own() -> None:
    rs = sample("thread_join.native")
    worker = next(t for t in rs.threads if t.name == "worker")
    assert describe(worker) == ("lock", "threading lock")


def py(name: str, path: str, line: int = 1) -> Frame:
    return Frame(name, path, line, None, False)


def c(name: str, lib: str = "/usr/lib/x86_64-linux-gnu/libc.so.6") -> Frame:
    return Frame(name, lib, 0, lib, True)


SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
USER = py("step", "/job/train.py", 88)


@pytest.mark.parametrize(("frames", "kind"), [
    ((c("cudaStreamSynchronize", "/usr/lib/libcudart.so.12"),
      c("c10::cuda::memcpy_and_sync", f"{SITE}/torch/lib/libc10_cuda.so"),
      py("Tensor.item", f"{SITE}/torch/_tensor.py"), USER), "gpu"),
    ((c("ncclAllReduce", f"{SITE}/nvidia/nccl/lib/libnccl.so.2"), USER), "collective"),
    ((py("wait", f"{SITE}/torch/distributed/distributed_c10d.py"), USER), "collective"),
    ((c("clock_nanosleep"), c("time_sleep", "/usr/lib/libpython3.11.so"),
      py("BaseFileLock.acquire", f"{SITE}/filelock/_api.py"), USER), "lock"),
    ((c("recv"), c("sock_recv_impl", "/usr/lib/libpython3.11.so"),
      py("socket.recv_into", f"{STDLIB}/socket.py"), USER), "io"),
    ((py("_PollLikeSelector.select", f"{STDLIB}/selectors.py"), USER), "io"),
    ((py("Queue.get", f"{STDLIB}/multiprocessing/queues.py"), USER), "dataloader"),
    ((py("read", "/job/train.py"),), "blocked"),  # the user's own read() is not I/O
    ((), "unknown"),
])
def test_classify_patterns(frames: tuple[Frame, ...], kind: str) -> None:
    assert classify(ThreadStack(1, "MainThread", True, False, frames)) == kind


def test_a_busy_thread_outside_known_calls_computes_an_idle_one_is_blocked() -> None:
    frames = (c("at::native::addmm_out", f"{SITE}/torch/lib/libtorch_cpu.so"), USER)
    assert describe(ThreadStack(1, None, False, True, frames)) == (
        "compute", "at::native::addmm_out")
    assert classify(ThreadStack(1, None, True, False, frames)) == "blocked"
    assert classify(ThreadStack(1, None, None, None, frames)) == "compute"


def test_classify_of_nothing_is_unknown() -> None:
    assert classify(None) == "unknown"


def test_frame_paths_are_shortened_like_py_spys() -> None:
    assert py("f", f"{SITE}/torch/utils/data/dataloader.py").short_filename == (
        "torch/utils/data/dataloader.py")
    assert py("f", f"{STDLIB}/multiprocessing/queues.py").short_filename == (
        "multiprocessing/queues.py")
    assert USER.short_filename == "train.py" and USER.is_user_code
    assert not py("f", f"{STDLIB}/threading.py").is_user_code
    # trainguard's own integrations, installed from a source tree (walk-through 25: a rank
    # "waits in a collective at .../src/trainguard/integrations/hf.py:121")
    assert not py("train_resuming", "/work/main/src/trainguard/integrations/hf.py").is_user_code
    assert USER.where() == "train.py:88 in step"
    assert c("read").where() == "libc.so.6 in read"


# -- the culprit -------------------------------------------------------------------------

AR = "gloo_allreduce_rank0.native"


def test_three_in_allreduce_one_in_the_data_loader() -> None:
    v = culprit({0: AR, 1: AR, 2: "dataloader_workers.native", 3: AR})
    assert v.rank == 2
    assert v.by_rank == {0: "collective", 1: "collective", 2: "dataloader", 3: "collective"}
    assert v.frame == "/tmp/spy/dl.py:15 in main"
    assert v.reason.startswith("Rank 2 is in the data loader")
    assert "ranks 0, 1, 3 wait in a collective (all_reduce)" in v.reason
    assert v.confidence >= 0.9


def test_three_in_allreduce_one_sleeping_in_user_code() -> None:
    v = culprit({0: AR, 1: "gloo_sleep_rank1.native", 2: AR, 3: AR},
                {0: 10, 1: 10, 2: 10, 3: 10})
    assert (v.rank, v.by_rank[1], v.frame) == (1, "sleep", "/tmp/spy/gloo.py:12 in step")
    assert "Rank 1 is sleeping (time.sleep" in v.reason


def test_one_spinning_in_a_python_loop() -> None:
    v = culprit({0: AR, 1: AR, 2: "spin.native", 3: AR})
    assert (v.rank, v.by_rank[2], v.frame) == (2, "compute", "/tmp/spy/spin.py:4 in spin")
    assert "Rank 2 is running code" in v.reason


def test_ddp_backward_waits_for_the_rank_that_sleeps() -> None:
    v = culprit({0: "ddp_backward_rank0.native", 1: "gloo_sleep_rank1.native"})
    assert (v.rank, v.by_rank) == (1, {0: "collective", 1: "sleep"})


def test_without_native_frames_the_rank_outside_the_collective_is_still_named() -> None:
    v = culprit({0: "gloo_allreduce_rank0", 1: "gloo_sleep_rank1"})
    assert (v.rank, v.by_rank) == (1, {0: "collective", 1: "blocked"})


def test_every_rank_in_one_file_lock_is_no_single_culprit() -> None:
    v = culprit({r: "flock.native" for r in range(4)})
    assert v.rank is None
    assert v.reason.startswith("Every rank is blocked on a lock (fcntl.flock")
    assert "no single culprit" in v.reason
    assert v.frame == "/tmp/spy/flock.py:4 in take_lock"
    assert set(v.by_rank.values()) == {"lock"}


def test_the_rank_behind_is_named_when_every_rank_waits() -> None:
    v = culprit({r: AR for r in range(4)}, {0: 42, 1: 30, 2: 42, 3: None})
    assert v.rank == 1
    assert "rank 1 fell behind" in v.reason and "Its last step is 30; the others reached 42" in (
        v.reason)


def test_every_rank_waiting_at_the_same_step_names_nobody() -> None:
    v = culprit({r: AR for r in range(4)}, {0: 42, 1: 42, 2: 42, 3: 42})
    assert v.rank is None and v.frame == "/tmp/spy/gloo.py:10 in step"
    assert v.reason.startswith("Every rank waits in a collective (all_reduce) at the same step")


def test_steps_choose_among_several_ranks_outside_the_collective() -> None:
    v = culprit({0: AR, 1: "spin.native", 2: "gloo_sleep_rank1.native", 3: AR},
                {0: 5, 1: 5, 2: 2, 3: 5})
    assert v.rank == 2
    assert "lowest of those behind" in v.reason
    no_steps = culprit({0: AR, 1: "spin.native", 2: "gloo_sleep_rank1.native", 3: AR})
    assert no_steps.rank == 1 and no_steps.confidence < v.confidence


def test_a_rank_in_another_collective_is_named() -> None:
    v = culprit({0: AR, 1: "gloo_barrier_rank0.native", 2: AR})
    assert v.rank == 1 and "different collectives" in v.reason and "barrier" in v.reason


def test_the_odd_one_out_when_nobody_waits_in_a_collective() -> None:
    v = culprit({0: "flock.native", 1: "flock.native", 2: "spin.native"})
    assert v.rank == 2 and v.by_rank == {0: "lock", 1: "lock", 2: "compute"}


def test_ranks_without_a_stack_are_said_and_suspected() -> None:
    err = "ptrace not permitted: run as root"
    stacks = {0: sample(AR, 0), 1: RankStack(1, 99, (), err), 2: sample(AR, 2)}
    v = name_culprit(stacks, {})
    assert v.by_rank == {0: "collective", 1: "error", 2: "collective"}
    assert v.rank == 1 and v.frame is None
    assert f"The stack of rank 1 could not be taken: {err}." in v.reason
    stacks[3] = sample("dataloader_workers.native", 3)
    v = name_culprit(stacks, {})
    assert v.rank == 3 and "rank 1 could not be taken" in v.reason
    nothing = name_culprit({0: RankStack(0, 1, (), "x"), 1: RankStack(1, 2, (), "y")}, {})
    assert (nothing.rank, nothing.confidence) == (None, 0.0)
    assert name_culprit({}, {}).rank is None


def test_ties_go_to_the_lowest_rank() -> None:
    v = culprit({3: "spin.native", 1: "spin.native", 0: AR, 2: AR})
    assert v.rank == 1


def test_stacks_that_lost_os_ids_and_modules_on_the_way_give_the_same_verdict() -> None:
    """What the controller rebuilds from protocol.StackDump: main thread first, no module."""
    def rebuilt(rs: RankStack) -> RankStack:
        main = main_thread(rs)
        order = [main, *(t for t in rs.threads if t is not main)]
        return replace(rs, threads=tuple(
            ThreadStack(t.thread_id, t.name, t.idle, t.owns_gil, tuple(
                Frame(f.name, f.filename, f.line or 0, None, f.native) for f in t.frames))
            for t in order if t is not None))
    ranks = {0: AR, 1: AR, 2: "dataloader_workers.native", 3: "flock.native"}
    direct = culprit(ranks)
    again = name_culprit({r: rebuilt(sample(n, r)) for r, n in ranks.items()}, {})
    assert (again.rank, again.by_rank, again.frame) == (direct.rank, direct.by_rank,
                                                        direct.frame)


# -- text --------------------------------------------------------------------------------

def test_render_text_reads_like_py_spy() -> None:
    text = render_text(sample("gloo_allreduce_rank0.native", rank=3))
    lines = text.splitlines()
    assert lines[0].startswith("Rank 3, process ")
    assert lines[1].startswith("Thread ") and lines[1].endswith('(idle): "MainThread"')
    assert "    all_reduce (torch/distributed/distributed_c10d.py:3252)" in lines
    assert "    step (gloo.py:10)" in lines
    assert "    pthread_cond_wait (libc.so.6)" in lines
    spin = render_text(sample("spin.native"))
    assert "(active+gil)" in spin


def test_render_text_of_a_rank_without_stack() -> None:
    assert render_text(RankStack(2, 77, (), "process 77 is not running")) == (
        "Rank 2, process 77: no stack: process 77 is not running\n")


def test_a_main_thread_in_the_interpreters_shutdown_is_finalizing() -> None:
    def thread(*frames: Frame) -> ThreadStack:
        return ThreadStack(1, "MainThread", False, True, frames)

    native = thread(Frame("gc_collect_main", "gcmodule.c", 1, None, True),
                    Frame("Py_FinalizeEx", "pylifecycle.c", 2, None, True))
    joining = thread(Frame("_wait_for_tstate_lock", "/usr/lib/python3.11/threading.py", 1),
                     Frame("_shutdown", "/usr/lib/python3.11/threading.py", 2))
    training = thread(Frame("allreduce", "distributed_c10d.py", 1),
                      Frame("<module>", "train.py", 9))
    sleeping = thread(Frame("_shutdown", "train.py", 3))  # the user's own _shutdown
    assert finalizing(native) and finalizing(joining)
    assert not finalizing(training) and not finalizing(sleeping) and not finalizing(None)
