"""What one thread is doing, from its frames (innermost first, as py-spy gives them). Pure.

The native frames (`py-spy dump --native`) make the difference between a thread that sleeps,
one blocked in `flock` and one in a collective's wait: without them the innermost frame of
all three is the user's function that made the call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainguard.diagnosis.lines import is_trainguards

COLLECTIVE, GPU, DATALOADER, LOCK = "collective", "gpu", "dataloader", "lock"
SLEEP, IO, BLOCKED, COMPUTE, UNKNOWN, ERROR = ("sleep", "io", "blocked", "compute", "unknown",
                                               "error")
STOPPED = "state_t"  # the process is stopped (state T: SIGSTOP, Ctrl-Z, a debugger)
# Waiting on the other ranks: a collective, or (NCCL) the GPU stream a collective is queued on.
WAITING = frozenset({COLLECTIVE, GPU})
# (one rank, several ranks) for each classification.
PHRASES = {
    COLLECTIVE: ("waits in a collective", "wait in a collective"),
    GPU: ("waits for the GPU", "wait for the GPU"),
    DATALOADER: ("is in the data loader", "are in the data loader"),
    LOCK: ("is blocked on a lock", "are blocked on a lock"),
    SLEEP: ("is sleeping", "are sleeping"),
    IO: ("is blocked in I/O", "are blocked in I/O"),
    BLOCKED: ("is blocked outside Python code", "are blocked outside Python code"),
    COMPUTE: ("is running code", "are running code"),  # Python, or a native kernel it called
    UNKNOWN: ("shows no Python frames", "show no Python frames"),
    ERROR: ("could not be inspected", "could not be inspected"),
    STOPPED: ("is stopped (state T)", "are stopped (state T)"),
}

_LIB_ROOT = re.compile(r".*/(?:site|dist)-packages/|.*/lib/python\d+(?:\.\d+)?t?/")
_COLLECTIVE_FUNCS = frozenset({
    "all_reduce", "allreduce", "all_reduce_coalesced", "barrier", "monitored_barrier",
    "broadcast", "broadcast_object_list", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_gather_coalesced", "_all_gather_base", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "gather", "gather_object", "scatter",
    "scatter_object_list", "all_to_all", "all_to_all_single", "send", "recv",
    "send_object_list", "recv_object_list", "batch_isend_irecv", "wait", "_wait", "wait_tensor",
    "_store_based_barrier", "init_process_group", "new_group", "destroy_process_group"})
_COLLECTIVE_NATIVE = re.compile(r"c10d::|gloo::|nccl|ProcessGroup(?:NCCL|Gloo)", re.I)
_COLLECTIVE_LIB = re.compile(r"lib(?:nccl|gloo)")
_GPU_NATIVE = re.compile(r"cuda(?:Stream|Device|Event)Synchronize|cu(?:Stream|Ctx|Event)"
                         r"Synchronize|cudaMemcpy|cuMemcpy|memcpy_and_sync")
_GPU_LIB = re.compile(r"libcuda(?:rt)?\.so")
_FILE_LOCK_NATIVE = {"flock": "fcntl.flock", "fcntl_flock": "fcntl.flock",
                     "fcntl_flock_impl": "fcntl.flock", "lockf": "fcntl.lockf",
                     "fcntl_lockf": "fcntl.lockf", "fcntl_lockf_impl": "fcntl.lockf"}
_THREAD_LOCK_NATIVE = frozenset({
    "PyThread_acquire_lock_timed", "PyThread_acquire_lock", "lock_PyThread_acquire_lock",
    "acquire_timed", "rlock_acquire", "pthread_mutex_lock", "__lll_lock_wait", "sem_wait",
    "sem_timedwait", "sem_clockwait", "do_futex_wait"})
_THREAD_LOCK = "threading lock"
_LOCK_PY_FUNCS = frozenset({"acquire", "wait", "join", "get"})
_LOCK_PY_FILES = ("threading.py", "queue.py", "multiprocessing/synchronize.py")
_LOCK_PACKAGES = ("filelock/", "portalocker/", "fasteners/")
_SLEEP_NATIVE = frozenset({
    "clock_nanosleep", "nanosleep", "__nanosleep", "usleep", "time_sleep", "pysleep"})
_IO_NATIVE = frozenset({
    "read", "write", "__libc_read", "__libc_write", "pread", "pread64", "pwrite", "pwrite64",
    "readv", "writev", "recv", "recvfrom", "recvmsg", "send", "sendto", "sendmsg", "poll",
    "ppoll", "__poll", "select", "pselect", "pselect6", "__select", "epoll_wait", "epoll_pwait",
    "open", "open64", "openat", "openat64", "__open64", "__libc_open64", "fsync", "fdatasync",
    "sync_file_range", "accept", "accept4", "connect"})
_IO_NATIVE_PREFIX = ("_io_", "os_read", "os_write", "os_fsync", "os_open", "sock_", "select_",
                     "_ssl__")
_IO_PY_FILES = ("selectors.py", "socket.py", "ssl.py", "subprocess.py", "_pyio.py", "http/",
                "urllib3/", "requests/", "fsspec/", "s3fs/", "botocore/", "gcsfs/", "adlfs/")
_IO_PY_FUNCS = frozenset({
    "read", "write", "readline", "readinto", "recv", "recv_into", "send", "sendall", "select",
    "poll", "communicate", "fsync", "open", "flush"})


@dataclass(frozen=True)
class Frame:
    name: str
    filename: str
    line: int
    module: str | None = None  # py-spy: the shared object of a native frame
    native: bool = False

    @property
    def func(self) -> str:
        """The bare function name: `all_reduce` of `_Wrapper.all_reduce`."""
        return self.name if self.native else self.name.rsplit(".", 1)[-1]

    @property
    def short_filename(self) -> str:
        """The path from the package root (`torch/utils/data/dataloader.py`), like py-spy's."""
        path = self.filename.replace("\\", "/")
        m = _LIB_ROOT.match(path)
        return path[m.end():] if m else path.rsplit("/", 1)[-1]

    @property
    def is_user_code(self) -> bool:
        """A Python frame outside the standard library, installed packages and trainguard's
        own code (its trainer integrations, installed from a source tree too: walk-through
        25 named integrations/hf.py as where a rank waited)."""
        return not (self.native or self.filename.startswith("<frozen")
                    or _LIB_ROOT.match(self.filename.replace("\\", "/"))
                    or is_trainguards(self.filename))

    def where(self, full: bool = False) -> str:
        """`train.py:88 in step`; `full`: the path as the process has it (one to open)."""
        name = (self.filename or self.short_filename) if full else self.short_filename
        at = f"{name}:{self.line}" if self.line else name
        return f"{at} in {self.name}"


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int
    name: str | None
    idle: bool | None
    owns_gil: bool | None
    frames: tuple[Frame, ...]  # innermost first
    os_thread_id: int | None = None


def _native_name(f: Frame) -> str:
    """A C++ name without its arguments and templates: `c10d::Work::wait`."""
    return re.sub(r"<[^<>]*>", "", f.name.split("(", 1)[0]).strip()[:80]


def _collective(frames: tuple[Frame, ...]) -> str | None:
    for f in frames:
        if (not f.native and "torch/distributed/" in f.filename.replace("\\", "/")
                and f.func in _COLLECTIVE_FUNCS):
            return f.func
    for f in frames:
        if f.native and (_COLLECTIVE_NATIVE.search(f.name) or _COLLECTIVE_LIB.search(f.filename)):
            return _native_name(f)
    return None


def _gpu(frames: tuple[Frame, ...]) -> str | None:
    for f in frames:
        if f.native and (_GPU_NATIVE.search(f.name) or _GPU_LIB.search(f.filename)):
            return _native_name(f)
        if not f.native and f.func == "synchronize" and "torch/cuda/" in f.short_filename:
            return "torch.cuda.synchronize"
    return None


def _dataloader(frames: tuple[Frame, ...]) -> str | None:
    py = [f for f in frames if not f.native]
    for f in py:  # the loader's iterator method says most: _try_get_data waits for workers
        if f.short_filename == "torch/utils/data/dataloader.py":
            return f.name
    for f in py:
        if f.short_filename.startswith(("torch/utils/data/", "torchdata/")):
            return f.name
    for f in py:
        if f.short_filename == "multiprocessing/queues.py" and f.func == "get":
            return "multiprocessing Queue.get"
    return None


_BACKWARD = "autograd backward (DDP's gradient all-reduce)"


def _in_backward(frames: tuple[Frame, ...]) -> bool:
    """A thread in autograd's backward that is not running code: without native frames (a
    look, or a native dump that timed out under load) DDP's wait for the gradient
    all-reduce shows only this (walk-through 30: the culprit went unnamed)."""
    return any(not f.native and f.func == "_engine_run_backward"
               and f.short_filename == "torch/autograd/graph.py" for f in frames)


def _lock(f: Frame) -> str | None:
    if f.native:
        if f.name in _FILE_LOCK_NATIVE:
            return _FILE_LOCK_NATIVE[f.name]
        return _THREAD_LOCK if f.name in _THREAD_LOCK_NATIVE else None
    short = f.short_filename
    if short.startswith(_LOCK_PACKAGES):
        return short.split("/", 1)[0]
    return f.name if short in _LOCK_PY_FILES and f.func in _LOCK_PY_FUNCS else None


def _sleep(f: Frame) -> str | None:
    return "time.sleep" if f.native and f.name in _SLEEP_NATIVE else None


def _io(f: Frame) -> str | None:
    if f.native:
        ok = f.name in _IO_NATIVE or f.name.startswith(_IO_NATIVE_PREFIX)
        return f.name if ok else None
    short = f.short_filename
    lib = not f.is_user_code
    return f.name if lib and (short.startswith(_IO_PY_FILES) or (
        "/" not in short and f.func in _IO_PY_FUNCS)) else None


def describe(thread: ThreadStack | None) -> tuple[str, str]:
    """(classification, what exactly: `all_reduce`, `fcntl.flock`, `time.sleep`...)."""
    if thread is None or not thread.frames:
        return UNKNOWN, ""
    frames = thread.frames
    for kind, find in ((COLLECTIVE, _collective), (GPU, _gpu), (DATALOADER, _dataloader)):
        found = find(frames)
        if found:
            return kind, found
    if thread.idle is not False and _in_backward(frames):
        return COLLECTIVE, _BACKWARD
    locks = [d for d in map(_lock, frames) if d]
    if locks:  # a named lock (fcntl.flock, Thread.join) says more than the native acquire
        return LOCK, next((d for d in locks if d != _THREAD_LOCK), locks[0])
    for kind, match in ((SLEEP, _sleep), (IO, _io)):
        for f in frames:
            detail = match(f)
            if detail:
                return kind, detail
    if thread.idle:  # blocked where py-spy shows no frame we know (no --native: time.sleep too)
        return BLOCKED, _inner(frames)
    return COMPUTE, _inner(frames)


def _inner(frames: tuple[Frame, ...]) -> str:
    """The innermost frame's name when it is not the user's own (shown as the location)."""
    f = frames[0]
    return "" if f.is_user_code else _native_name(f) if f.native else f.name


def classify(thread: ThreadStack | None) -> str:
    """What a (main) thread does: one of collective, gpu, dataloader, lock, sleep, io, blocked
    (idle in a call we cannot name, as with no native frames), compute, unknown (no frames)."""
    return describe(thread)[0]


def culprit_frame(thread: ThreadStack | None) -> str | None:
    """The innermost user-code frame, else the innermost Python frame, else the innermost."""
    if thread is None or not thread.frames:
        return None
    for pick in (lambda f: f.is_user_code, lambda f: not f.native, lambda f: True):
        for f in thread.frames:
            if pick(f):  # the full path, as a traceback's culprit frame has it
                return f.where(full=True)
    return None




# the interpreter's own shutdown: the script returned or called exit, and Python runs its
# atexit functions, joins non-daemon threads, collects and frees the modules
_FINALIZE_NATIVE = frozenset({
    "Py_FinalizeEx", "Py_Finalize", "_Py_Finalize", "Py_Exit", "finalize_modules",
    "finalize_interp_clear", "_PyImport_Fini", "_PyAtExit_Call", "atexit_callfuncs",
    "wait_for_thread_shutdown"})


def finalizing(thread: ThreadStack | None) -> bool:
    """Whether a main thread runs the interpreter's shutdown (the rank is exiting, not hung):
    a native finalization frame, or threading's `_shutdown` joining the threads left."""
    if thread is None:
        return False
    for f in thread.frames:
        if f.native and _native_name(f) in _FINALIZE_NATIVE:
            return True
        if not f.native and f.name == "_shutdown" and f.filename.endswith("threading.py"):
            return True
    return False
