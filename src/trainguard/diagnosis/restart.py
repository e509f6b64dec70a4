"""Whether a restart helps, from the whole story and not the category alone. Pure.

The category gives a default (rules.yaml, families.yaml); the rest of what the attempt
printed can overrule it (docs/diagnosis.md, "Restart verdict", holds this table):

| category | what else the logs show | restart helps |
|---|---|---|
| nccl_timeout_or_hang | ranks wait in different collectives at one SeqNum (a desync) | no |
| nccl_timeout_or_hang | a rank is named as missing from the collective or barrier | no |
| nccl_timeout_or_hang | another rank died of an error that repeats (code, config...) | no |
| nccl_timeout_or_hang | a rank was still preparing the data (its progress bar) | no |
| nccl_timeout_or_hang | a rank was still evaluating (its progress bar or start) | no |
| nccl_timeout_or_hang | nothing else | yes |
| port_conflict | - | yes (a fresh port) |
| gpu_hardware, npu_hardware_or_driver | the node is isolated (Xid, ECC, device) | yes |
| gpu_hardware | not isolated | maybe |
| npu_hardware_or_driver | the device reports a task that raised on it (not a timeout) | no |
| npu_hardware_or_driver | not isolated (an operator or driver error) | its rule's |
| port_conflict | the port is a well-known one (< 1024: a system service's) | no |
| port_conflict | a server's own listening port (Go's `listen tcp ...: bind:`) | no |
| network_or_rendezvous | no name resolution, ssh refused here or on :22, 127.0.1.1, no NIC | no |
| network_or_rendezvous | an address in 0.0.0.0/8 (a number read as a host: 0.0.0.5) | no |
| network_or_rendezvous | more workers reached the store than the world has (stale) | no |
| network_or_rendezvous | a store client failed to connect (not: timed out waiting) | no |
| network_or_rendezvous | gloo could not connect its full mesh (the interface it picked) | no |
| cuda_kernel_error | the error is a misaligned address (the inputs' layout decides it) | no |
| segfault_or_abort | an illegal instruction (SIGILL: a build for another CPU) | no |
| segfault_or_abort | the crash's stack is inside an import (importlib's loader frames) | no |
| dataloader_worker_crash | the logs show Windows or macOS paths (workers are spawned) | no |
| nccl_communication_error | NCCL says a feature is not supported (P2P/IPC between GPUs) | no |
| cuda_kernel_error | a CUDA library says the call is not supported (cuBLAS's status) | no |
| nccl_communication_error | NCCL's socket transport uses a virtual interface (docker, lo) | no |
| other (a remote service) | the network is unreachable from the machine | no |
| segfault_or_abort | only the shell or an IDE reports it (`Segmentation fault`) | no |
| any other | - | the category's default |
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from functools import cache

from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.rules import load_rules
from trainguard.diagnosis.taxonomy import Category, Diagnosis, RestartHelps

_WORK = re.compile(r"SeqNum=(\d+), OpType=(\w+)(?:.*?NumelIn=(\d+))?")
_MISSING = re.compile(
    r"(?:ranks?|processes)\W+[\d, ]+\W+(?:\w+ ){0,3}(?:failed to pass|did not (?:join|reach|"
    r"arrive)|have not (?:joined|arrived)|never (?:joined|arrived)|missing from)"
    r"|not (?:joined|reached) by ranks?|missing ranks?:|ranks? [\d, ]+ (?:is|are) missing",
    re.IGNORECASE)
_DETERMINISTIC = (Category.USER_CODE_ERROR, Category.CONFIG_ERROR,
                  Category.DEPENDENCY_OR_IMPORT_ERROR, Category.CHECKPOINT_LOAD_ERROR,
                  Category.GPU_OOM, Category.NUMERICAL)
_HARDWARE = (Category.GPU_HARDWARE, Category.NPU_HARDWARE_OR_DRIVER)
_BAD_ADDRESS = re.compile(
    r"name or service not known|host not found|could not resolve|nodename nor servname|"
    r"temporary failure in name resolution|no address associated|getaddrinfo|"
    r"\bssh\b.*(?:denied|returned non-zero|exit status 255)|permission denied \(publickey"
    # ssh refused on this machine or on sshd's own port 22: no ssh server there, the same on
    # every start; a refusal on another host's own port (Horovod's or an MPI operator's sshd
    # in the peer's container, `port 12345`) is a peer whose sshd is not listening yet, which
    # a rerun can meet (both such logs of the sets say `yes`, the one on localhost:22 `no`)
    r"|\bssh: connect to host (?:localhost|127(?:\.\d{1,3}){3}|::1|\S+ port 22:)"
    r"[^\n]*refused"
    # an address on Debian's loopback alias for the host's own name (127.0.1.1 in /etc/hosts):
    # the peers were told to reach this host where no one else can
    r"|(?<![\w.])127\.0\.1\.1(?![\w.])"
    # an interface the transport was told to use that the machine lacks
    r"|(?:unable to|cannot|can.t|could not|failed to) find (?:an? )?(?:ip )?(?:address|"
    r"interface|device) for\b|no such (?:network )?interface\b"
    # an address in 0.0.0.0/8 is no host: a number taken for one (MASTER_ADDR=5 is 0.0.0.5)
    r"|(?<![\w.])0\.(?!0\.0\.0(?![\d.]))\d{1,3}\.\d{1,3}\.\d{1,3}(?![\w.])", re.IGNORECASE)
# a store-based barrier that counted more workers than the world has: a stale key or file
_STALE = re.compile(r"world_size=(\d+), worker_count=(\d+)")
# the port of a bind or connect ("[::]:22", "port 22", "127.0.0.1:22")
_PORT = re.compile(r"(?:\]:|\d\.\d{1,3}:|\blocalhost:|\bport[ :=]\s?)(\d{1,5})\b",
                   re.IGNORECASE)
_WELL_KNOWN = 1024
# a CUDA error (not a warning) that a kernel read through a misaligned address: the layout of
# its inputs (an offset view, an odd fp16 shape) decides it, and a rerun has the same inputs
# SIGILL in native code: a binary built for instructions this CPU lacks (AVX on a Celeron):
# the same binary on the same node fails the same way (a launcher may name only its number, 4)
_ILLEGAL = re.compile(r"illegal instruction|\bSIGILL\b|\b(?:with|on) signal 4\b", re.IGNORECASE)
# a native crash whose stack (faulthandler's: `File "...", line N in f`, no comma) holds
# importlib's loader frames: it crashed while a module or extension loaded (two builds that
# clash in one process), and every start imports the same way
_IMPORTING = re.compile(r'^\s*File "<frozen importlib\._bootstrap(?:_external)?>", line \d+ in ')
# CPython's own check that failed, named by the runtime function that made it (`Fatal Python
# error: none_dealloc: deallocating None`, `PyThreadState_Get: no current thread`; not a
# signal's name, `Fatal Python error: Segmentation fault`): a reference count or thread
# state broken by an extension's bug, which the same run reaches again (round 39: both logs
# of the sets with such a line say `no`)
_RUNTIME_CHECK = re.compile(r"Fatal Python error: [A-Za-z_]\w*: ")
# DataLoader workers on Windows and macOS are spawned, not forked: one that exits there is
# almost always the script failing to re-import or pickle in the child (no `if __name__ ==
# "__main__":` guard, an unpicklable dataset), which fails the same way every time
_SPAWN_PLATFORM = re.compile(r"(?<![\w/])[A-Za-z]:\\|/Users/\w|\bwin32\b|\\spawn\.py|_winapi",
                             re.IGNORECASE)
# NCCL saying the platform lacks what it needs (P2P or CUDA IPC between two GPUs, a
# transport): the same GPUs and driver lack it on a rerun
_UNSUPPORTED = re.compile(r"\bnot supported\b", re.IGNORECASE)
# ... or a CUDA library's status that it does not support the call (cuBLAS's
# `CUBLAS_STATUS_NOT_SUPPORTED` for a bf16 GEMM on this GPU): the same GPU, dtype and library
# on a rerun (the one such deciding line of the sets is labelled `no`)
_UNSUPPORTED_STATUS = re.compile(r"\bnot supported\b|_NOT_SUPPORTED\b", re.IGNORECASE)
# a store client that *failed* to connect to every address of its host (refused, no route),
# not one that timed out waiting for a peer that may come late: the address, the port or a
# firewall is wrong, and a rerun meets the same
_CONNECT_FAILED = re.compile(r"\bhas failed to connect to\b", re.IGNORECASE)
# a remote service the machine has no route to (an offline cluster), or a rendezvous store's
# address it has none to (a TCPStore's `Network is unreachable`: the address is wrong, the
# one such case of the sets says `no`): a rerun has none either
_NO_ROUTE = re.compile(r"network is unreachable|\[Errno 101\]", re.IGNORECASE)
# a rank still preparing the data when the others' wait ran out (a progress bar of
# tokenizing, preprocessing or mapping a dataset, or of scanning its files: YOLOv5's `train:
# Scanning '../coco/labels/train' images and labels...43718 found, ...:  97%|`, whose counts
# make the text before the percentage long): it takes as long again on a rerun
_DATA_PREP = re.compile(r"(?:tokeniz\w*|pre-?process\w*|on dataset|\bmap\b|filter\w*|packing|"
                        r"grouping texts)[^|\n]{0,60}?\s\d{1,3}%\s*\||"
                        r"\bscanning\b[^|\n]{0,160}?\s\d{1,3}%\s*\|", re.IGNORECASE)
# ... or still evaluating: an evaluation's progress bar (`eval model:: 99%|`) or its start
# (`Evaluating the results...`) among the last lines, typically on one rank while the others
# wait in a collective; it takes as long again on a rerun (both such cases of the labelled
# sets say `no`; a log line that only names an evaluation, `[eval] global_step = 0`, is not one)
_EVALUATING = re.compile(r"(?:eval\w*|validat\w*)[^|\n]{0,60}?\s\d{1,3}%\s*\||"
                         r"^\s*(?:evaluating|validating)\b.{0,60}\.\.\.\s*$", re.IGNORECASE)
# NCCL's socket transport listing a container's or VM's virtual interface among those it uses
_VIRTUAL_IF = re.compile(r"^\s*\[\d+\](?:docker\d*|br-[0-9a-f]+|veth\w+|virbr\d*|lo):")
# ... or its INFO line naming one it uses (`NET : Using interface lo:127.0.0.1<0>`), in any
# line kept (both cases of the labelled sets with either say `no`)
_VIRTUAL_IF_USED = re.compile(
    r"\bNET\s*:\s*Using interface (?:docker\d*|br-[0-9a-f]+|veth\w+|virbr\d*|lo):")
# a native crash that only the shell reports (`Segmentation fault (core dumped)`, bash's or
# zsh's job line), or an IDE's run window (PyCharm's `Process finished with exit code 139
# (interrupted by signal 11: SIGSEGV)`), with no error of its own before it: the same program
# on the same inputs crashes at the same point (13 of the 15 such cases of the labelled sets
# say `no`: 11 of 13 of the shell's, 2 of 2 of the IDE's); in the shell's locale too (glibc's
# translated strsignal(SIGSEGV), bash's translated "(core dumped)": `段错误 (核心已转储)`; the
# translations are kept once, in rules.yaml's `words:`)
@cache
def _shell_segv() -> re.Pattern[str]:
    """Compiled on first use: the rules (their `words:`) load only when a verdict is read."""
    words = load_rules().words
    return re.compile(r"^(?:(?:\S+: (?:line \d+|第 ?\d+ ?行)[:\uff1a]\s*)?(?:\d+\s+)?"
                      rf"(?:segmentation fault|{words['segfault']})\s*[(\uff08]"
                      rf"(?:core dumped|{words['core_dumped']})[)\uff09]|"
                      r"process finished with exit code \d+ \(interrupted by signal 11\b)",
                      re.IGNORECASE)


# a verbs call that sets up a queue pair refused as invalid or for a device that is not there
# (`Call to ibv_modify_qp failed with error Invalid argument`, `... No such device`): the
# attributes NCCL gives it (the GID index, the port, RoCE's address) do not fit this fabric,
# and a rerun gives the same (all 3 such logs of the sets say `no`; a modify that fails with
# `Network is unreachable` is the link's, and keeps `yes`)
_QP_REFUSED = re.compile(r"ibv_modify_qp failed with error (?:Invalid argument|No such device)")
# gloo that could not build its full mesh when the process group was set up ("connectFullMesh
# failed"): the interface it picked does not reach the peers, and a rerun picks the same
_GLOO_MESH = re.compile(r"connectFullMesh failed", re.IGNORECASE)
_MISALIGNED = re.compile(r"\berror\b\W+(?:\w+\W+){0,2}misaligned address", re.IGNORECASE)
# an Ascend device's own report of a task that raised on it (`The error from device(chipId:1,
# dieId:0), serial number is 6.`, `..., there is an exception of fftsplus aivector error`), not
# one that timed out: an operator's fault on its inputs, whichever line the answer is read from
# (round 38: the 10 logs of the sets with one are all npu_hardware_or_driver/no)
_DEVICE_TASK_FAULT = re.compile(r"The error from device\(chipId:\d+, dieId:\d+\), serial number is "
                                r"\d+(?:\.\s*$|[.,] (?:there is an?|an exception occurred))")


def desynced(findings: Sequence[Finding]) -> bool:
    """Ranks' timed-out works differ at one sequence number (op type or size). Different ops
    at different sequence numbers are ranks at different points of the same program (one
    is a collective or two behind: a straggler), which a rerun need not repeat."""
    seen: dict[str, set[tuple[str, str | None]]] = {}
    for f in findings:
        if f.context:
            continue
        m = _WORK.search(f.text)
        if m is not None:
            seen.setdefault(m.group(1), set()).add((m.group(2), m.group(3)))
    return any(len(w) > 1 for w in seen.values())


def story_restart(d: Diagnosis, findings: Sequence[Finding],
                  deterministic: Sequence[Category] = ()) -> Diagnosis:
    """`d` with the restart verdict the whole story supports. `deterministic`: the
    categories of the causes other ranks died of (final exceptions the rules know)."""
    verdict, why = d.restart_helps, ""
    cat = d.category
    if cat == Category.NCCL_TIMEOUT_OR_HANG:
        if desynced(findings):
            verdict, why = RestartHelps.NO, "the ranks wait in different collectives"
        elif any(_MISSING.search(f.text) for f in findings if not f.context):
            verdict, why = RestartHelps.NO, "a rank never joined the collective"
        elif any(c in _DETERMINISTIC for c in deterministic):
            verdict, why = RestartHelps.NO, "a rank died of an error that repeats"
        elif any(_DATA_PREP.search(f.text) for f in findings):
            verdict, why = RestartHelps.NO, ("a rank was still preparing the data when the "
                                             "others' wait ran out: it takes as long again")
        elif any(_EVALUATING.search(f.text) for f in findings):
            verdict, why = RestartHelps.NO, ("a rank was still evaluating when the others' "
                                             "wait ran out: it takes as long again")
        else:
            verdict = RestartHelps.YES
    elif cat == Category.PORT_CONFLICT and _well_known_port(d):
        verdict, why = RestartHelps.NO, "a well-known port, a system service's, was configured"
    elif cat == Category.PORT_CONFLICT and d.subcategory == "server_port":
        verdict, why = RestartHelps.NO, ("the server's own port, held by another instance of "
                                         "it: a rerun meets it again")
    elif cat == Category.PORT_CONFLICT or (d.isolate_node and cat in _HARDWARE):
        verdict = RestartHelps.YES  # a fresh port; the job placed on healthy nodes
    elif cat == Category.GPU_HARDWARE:
        verdict = RestartHelps.MAYBE
    elif cat == Category.NPU_HARDWARE_OR_DRIVER and any(
            _DEVICE_TASK_FAULT.search(f.text) for f in findings):
        verdict, why = RestartHelps.NO, "the device reports an operator's task that raised on it"
    # npu_hardware_or_driver not isolated: an operator or driver error code, whose rule says
    # whether it repeats (the Ascend codes differ: a timeout that passes, an operator that
    # fails the same way every time)
    elif cat == Category.NETWORK_OR_RENDEZVOUS and d.evidence is not None \
            and _BAD_ADDRESS.search(d.evidence.text):
        verdict, why = RestartHelps.NO, "the address itself is wrong"
    elif cat == Category.CUDA_KERNEL_ERROR and d.evidence is not None \
            and _MISALIGNED.search(d.evidence.text):
        verdict, why = RestartHelps.NO, "a misaligned address comes from the inputs' layout"
    elif cat == Category.SEGFAULT_OR_ABORT and (d.subcategory == "sigill" or (
            d.evidence is not None and _ILLEGAL.search(d.evidence.text))):
        verdict, why = RestartHelps.NO, ("an illegal instruction: the build uses instructions "
                                         "this CPU lacks")
    elif cat == Category.SEGFAULT_OR_ABORT and any(_IMPORTING.search(f.text) for f in findings):
        verdict, why = RestartHelps.NO, ("it crashed while a module loaded: every start "
                                         "imports the same way")
    elif cat == Category.SEGFAULT_OR_ABORT and d.evidence is not None \
            and _RUNTIME_CHECK.search(d.evidence.text):
        verdict, why = RestartHelps.NO, ("the interpreter's own check failed (a broken reference "
                                         "count or thread state): the same run reaches it again")
    elif cat == Category.DATALOADER_WORKER_CRASH and any(
            _SPAWN_PLATFORM.search(f.text) for f in findings):
        verdict, why = RestartHelps.NO, ("DataLoader workers are spawned on Windows and macOS: "
                                         "one that exits fails the same way again")
    elif cat == Category.NCCL_COMMUNICATION_ERROR and d.evidence is not None \
            and _UNSUPPORTED.search(d.evidence.text):
        verdict, why = RestartHelps.NO, "NCCL needs what these GPUs or this driver lack"
    elif cat == Category.CUDA_KERNEL_ERROR and d.evidence is not None \
            and _UNSUPPORTED_STATUS.search(d.evidence.text):
        verdict, why = RestartHelps.NO, "the library does not support the call on this GPU"
    elif cat == Category.NCCL_COMMUNICATION_ERROR and d.evidence is not None \
            and _QP_REFUSED.search(d.evidence.text):
        verdict, why = RestartHelps.NO, ("the queue pair's attributes (GID index, port) do not "
                                         "fit this fabric")
    elif cat == Category.NCCL_COMMUNICATION_ERROR and (
            (d.evidence is not None and _VIRTUAL_IF.search(d.evidence.text))
            or any(_VIRTUAL_IF_USED.search(f.text) for f in findings)):
        verdict, why = RestartHelps.NO, ("NCCL uses a virtual interface; set "
                                         "NCCL_SOCKET_IFNAME to the one the peers share")
    elif cat in (Category.OTHER, Category.NETWORK_OR_RENDEZVOUS) and d.evidence is not None \
            and _NO_ROUTE.search(d.evidence.text):
        verdict, why = RestartHelps.NO, "the machine has no route to the address"
    elif cat == Category.SEGFAULT_OR_ABORT and d.evidence is not None \
            and _shell_segv().search(d.evidence.text.strip()):
        verdict, why = RestartHelps.NO, ("a native crash with no error before it: the same "
                                         "program on the same inputs crashes the same way")
    elif cat == Category.NETWORK_OR_RENDEZVOUS and d.evidence is not None \
            and _CONNECT_FAILED.search(d.evidence.text):
        verdict, why = RestartHelps.NO, ("the store's client could not connect to its host at "
                                         "all: the address, port or a firewall is wrong")
    elif cat == Category.NETWORK_OR_RENDEZVOUS and d.evidence is not None \
            and _GLOO_MESH.search(d.evidence.text):
        verdict, why = RestartHelps.NO, ("gloo could not connect its mesh: set "
                                         "GLOO_SOCKET_IFNAME to the interface the peers share")
    elif cat == Category.NETWORK_OR_RENDEZVOUS and _stale(findings):
        verdict, why = RestartHelps.NO, ("more workers reached the store than the world has: "
                                         "a stale rendezvous key or file")
    if verdict == d.restart_helps:
        return d
    advice = f"{d.advice} Restart helps: {verdict.value}" + (f" ({why})." if why else ".")
    return replace(d, restart_helps=verdict, advice=advice)


def _well_known_port(d: Diagnosis) -> bool:
    m = _PORT.search(d.evidence.text) if d.evidence is not None else None
    return m is not None and 0 < int(m.group(1)) < _WELL_KNOWN


def _stale(findings: Sequence[Finding]) -> bool:
    for f in findings:
        m = _STALE.search(f.text)
        if m is not None and int(m.group(2)) > int(m.group(1)):
            return True
    return False
