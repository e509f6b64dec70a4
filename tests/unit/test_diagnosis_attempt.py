"""The launcher's diagnosis: realistic worker exits and rank logs -> category, restart verdict,
culprit (trainguard.diagnosis.attempt, through the same scanner the agent runs)."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import pytest

from trainguard.diagnosis.attempt import diagnose_attempt
from trainguard.diagnosis.sources import scan_lines
from trainguard.diagnosis.taxonomy import Diagnosis, RestartHelps
from trainguard.protocol import WorkerFact
from trainguard.states import WorkerState

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)

GLOO_RESET = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
    "Read error [127.0.0.1]:33175: Connection reset by peer. This may indicate a possible "
    "application crash on rank 0 or a network set up issue."
)
# torch 2.13's wording, as a real run printed it (the walk-through's job)
GLOO_RESET_2_13 = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
    "Read error [127.0.0.1]:35005: Connection reset by peer. This is typically caused by a "
    "remote worker hanging or bugs in the application. Check the logs of the remote worker "
    "before reporting an error. GLHF! \U0001f3d6\ufe0f"
)
NCCL_WATCHDOG = (
    "[rank0]:[E1107 10:00:00.000000 123 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600071 milliseconds before timing out."
)


def fact(
    rank: int,
    returncode: int | None,
    tail: Sequence[str] = (),
    *,
    ended_s: float | None = 0.0,
    state: WorkerState = WorkerState.FAILED,
    error_file: dict[str, object] | None = None,
) -> WorkerFact:
    return WorkerFact(
        rank=rank, local_rank=rank, pid=1000 + rank, state=state, returncode=returncode,
        started_at=T0, ended_at=None if ended_s is None else T0 + timedelta(seconds=ended_s),
        findings=scan_lines(tail, f"rank-{rank}.log", rank), error_file=error_file,
    )


def traceback(rank: int | None, *exc_lines: str, code: str = "loss.backward()") -> list[str]:
    """A Python traceback as torch prints it, with the `[rankN]: ` prefix when rank is given."""
    pre = "" if rank is None else f"[rank{rank}]: "
    return [
        f"{pre}step 14 loss 2.31",
        f"{pre}Traceback (most recent call last):",
        f'{pre}  File "/workspace/train.py", line 88, in <module>',
        f"{pre}    main()",
        f'{pre}  File "/workspace/train.py", line 61, in main',
        f"{pre}    {code}",
        *(f"{pre}{ln}" for ln in exc_lines),
    ]


def only(*facts: WorkerFact) -> Diagnosis:
    d = diagnose_attempt(list(facts))
    assert d is not None
    return d


# --- one failed rank: what the log says -------------------------------------------------


def test_a_gloo_connection_reset_alone_is_still_diagnosed_as_a_network_failure() -> None:
    d = only(fact(1, 1, traceback(1, GLOO_RESET)))
    assert d.category == "network_or_rendezvous"
    assert d.restart_helps == RestartHelps.YES
    assert d.culprit_rank == 1
    assert d.evidence is not None and "Connection reset by peer" in d.evidence.text


def test_the_rank_prefix_is_stripped_from_the_evidence() -> None:
    d = only(fact(1, 1, traceback(1, GLOO_RESET)))
    assert d.evidence is not None and not d.evidence.text.startswith("[rank")


def test_cuda_out_of_memory_is_a_user_error_that_a_restart_does_not_fix() -> None:
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
           "a total capacity of 79.10 GiB of which 1.20 GiB is free.")
    d = only(fact(0, 1, traceback(0, oom)))
    assert (d.category, d.fault_domain, d.restart_helps) == ("gpu_oom", "user_code",
                                                             RestartHelps.NO)
    assert d.culprit_rank == 0


XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4121, GPU has fallen off the bus."


def test_an_xid_79_line_is_a_gpu_hardware_fault_that_isolates_the_node() -> None:
    d = only(fact(3, -6, ["step 200 loss 1.9", XID_79]))
    assert d.category == "gpu_hardware"
    assert d.restart_helps == RestartHelps.YES
    assert d.isolate_node is True
    assert d.culprit_rank == 3


def test_an_xid_that_is_not_a_hardware_code_is_not_a_gpu_hardware_fault() -> None:
    d = only(fact(0, 1, ["NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception"]))
    assert d.category != "gpu_hardware"


def test_no_space_left_on_device_is_a_storage_fault_a_restart_may_fix() -> None:
    d = only(fact(0, 1, traceback(
        0, "OSError: [Errno 28] No space left on device: '/ckpt/step-100.tmp'",
        code="torch.save(state, path)")))
    assert (d.category, d.fault_domain) == ("disk_full_or_storage_io", "storage")
    assert d.restart_helps == RestartHelps.MAYBE


def test_a_missing_module_is_a_dependency_error_that_a_restart_does_not_fix() -> None:
    d = only(fact(0, 1, traceback(
        None, "ModuleNotFoundError: No module named 'transformers'", code="import transformers")))
    assert d.category == "dependency_or_import_error"
    assert d.restart_helps == RestartHelps.NO


def test_a_python_exception_without_a_known_cause_is_a_user_code_error() -> None:
    d = only(fact(2, 1, traceback(2, "ValueError: labels out of range: 50257 >= 50000")))
    assert d.category == "user_code_error"
    assert d.restart_helps == RestartHelps.NO
    assert d.culprit_rank == 2
    assert d.evidence is not None
    assert d.evidence.text == "ValueError: labels out of range: 50257 >= 50000"


def test_a_collective_timeout_raised_in_python_is_diagnosed_as_a_timeout() -> None:
    exc = "torch.distributed.DistBackendError: " + NCCL_WATCHDOG.split("] ", 2)[2]
    d = only(fact(0, 1, [NCCL_WATCHDOG, *traceback(0, exc)]))
    assert d.category == "nccl_timeout_or_hang"
    assert d.restart_helps == RestartHelps.YES


def test_the_torchrun_tee_prefix_is_understood_like_the_rank_prefix() -> None:
    tail = [f"[default0]:{ln}" for ln in traceback(None, "ValueError: bad shape")]
    d = only(fact(0, 1, tail))
    assert d.category == "user_code_error"
    assert d.evidence is not None and d.evidence.text == "ValueError: bad shape"


# --- exit codes and signals --------------------------------------------------------------


@pytest.mark.parametrize(
    ("returncode", "category", "helps"),
    [
        (-signal.SIGKILL, "host_oom", RestartHelps.MAYBE),
        (128 + signal.SIGKILL, "host_oom", RestartHelps.MAYBE),  # 137, as a shell reports it
        (-signal.SIGBUS, "shared_memory", RestartHelps.MAYBE),
        (128 + signal.SIGBUS, "shared_memory", RestartHelps.MAYBE),
        (-signal.SIGSEGV, "segfault_or_abort", RestartHelps.MAYBE),
        (-signal.SIGABRT, "segfault_or_abort", RestartHelps.MAYBE),
        (-signal.SIGUSR1, "killed_by_signal_unknown", RestartHelps.YES),
        (-signal.SIGTERM, "killed_by_signal_unknown", RestartHelps.YES),
        (128 + signal.SIGINT, "killed_by_signal_unknown", RestartHelps.YES),
    ],
)
def test_a_death_by_signal_without_any_log_is_judged_by_the_signal(
    returncode: int, category: str, helps: RestartHelps
) -> None:
    d = only(fact(1, returncode))
    assert (d.category, d.restart_helps, d.culprit_rank) == (category, helps, 1)
    assert d.from_log is False


def test_the_signal_name_appears_in_the_summary_of_an_unknown_signal() -> None:
    assert "SIGUSR1" in only(fact(0, -signal.SIGUSR1)).summary


@pytest.mark.parametrize("code", [1, 3, 255])
def test_a_plain_exit_code_without_any_log_is_other_and_not_restarted(code: int) -> None:
    d = only(fact(0, code, ["step 1 loss 3.0", "step 2 loss 2.9"]))
    assert d.category == "other"
    assert d.restart_helps == RestartHelps.NO
    assert str(code) in d.summary
    # walk-through 39 #8: the examples' `exit` fault failed the job with a bare "read the log"
    assert "TRAINGUARD_FAULT's `exit` fault" in d.advice and "--unconditional-restart" in \
        d.advice


def test_a_known_cause_in_the_log_beats_the_signal_that_killed_the_rank() -> None:
    d = only(fact(0, -signal.SIGKILL, ["Out of memory: Killed process 4121 (python)"]))
    assert d.category == "host_oom"
    assert d.from_log is True


# --- torch @record error files -----------------------------------------------------------


def error_file(message: str) -> dict[str, object]:
    return {"message": {"message": message, "extraInfo": {
        "py_callstack": 'Traceback (most recent call last):\n  File "train.py", line 9\n'
                        f"{message}\n",
        "timestamp": "1700000000"}}}


def test_the_error_file_message_is_the_exception_when_the_log_is_empty() -> None:
    d = only(fact(0, 1, error_file=error_file("RuntimeError: boom")))
    assert d.category == "user_code_error"
    assert d.evidence is not None and d.evidence.text == "RuntimeError: boom"


def test_a_known_cause_in_the_error_file_is_recognised() -> None:
    d = only(fact(0, 1, error_file=error_file("torch.OutOfMemoryError: CUDA out of memory.")))
    assert d.category == "gpu_oom"


def test_an_error_file_with_a_plain_string_message_is_read_too() -> None:
    d = only(fact(0, 1, error_file={"message": "ValueError: nope"}))
    assert d.evidence is not None and d.evidence.text == "ValueError: nope"


def test_the_logs_own_line_of_the_error_files_exception_is_the_evidence() -> None:
    """Walk-through 28: a @record script's live verdict took the error file's line (its
    whole-second stamp came before the log's) and said 'no traceback in the log says where'
    while `diagnose` of the job dir named the frame from the log."""
    stamp = "2023-11-14T22:13:20.594000+00:00 err "  # 0.594 s after the file's 1700000000
    log = [stamp + line for line in traceback(1, "ValueError: bad batch at it 15")]
    d = only(fact(1, 1, log, error_file=error_file("ValueError: bad batch at it 15")))
    assert d.evidence is not None and d.evidence.file == "rank-1.log", d.evidence
    assert d.culprit.frame is not None and "train.py:61 in main" in d.culprit.frame
    # the log names the class with its module, the file bare (walk-through 28)
    log = [stamp + line for line in traceback(1, "mytrain.errors.ShardError: shard 7 empty")]
    d = only(fact(1, 1, log, error_file=error_file("ShardError: shard 7 empty")))
    assert d.evidence is not None and d.evidence.file == "rank-1.log", d.evidence


def test_an_error_file_without_a_message_falls_back_to_the_log() -> None:
    d = only(fact(0, 1, traceback(0, "KeyError: 'lr'"), error_file={"message": {}}))
    assert d.evidence is not None and d.evidence.text == "KeyError: 'lr'"


# --- across ranks: root cause first, symptoms listed --------------------------------------


def test_the_rank_killed_first_is_the_culprit_and_the_peer_reset_is_a_symptom() -> None:
    killed = fact(0, -signal.SIGKILL, ["step 15 loss 2.2"], ended_s=0.0)
    victim = fact(1, 1, traceback(1, GLOO_RESET), ended_s=1.5)
    d = only(victim, killed)
    assert d.culprit_rank == 0
    assert d.category == "host_oom"
    assert d.restart_helps == RestartHelps.MAYBE
    assert any(s.rank == 1 and "Connection reset by peer" in s.text for s in d.symptoms)


def test_a_symptom_that_ended_first_does_not_hide_the_real_cause_on_another_rank() -> None:
    victim = fact(1, 1, traceback(1, GLOO_RESET), ended_s=0.0)
    killed = fact(0, -signal.SIGKILL, ended_s=2.0)
    d = only(victim, killed)
    assert d.culprit_rank == 0
    assert d.category == "host_oom"


def test_the_earliest_real_failure_wins_over_a_later_real_failure() -> None:
    first = fact(2, 1, traceback(2, "ValueError: bad batch"), ended_s=1.0)
    later = fact(0, -signal.SIGSEGV, ended_s=3.0)
    d = only(later, first)
    assert d.culprit_rank == 2
    assert d.category == "user_code_error"
    assert any(s.rank == 0 for s in d.symptoms)


def test_a_rank_without_an_end_time_sorts_after_those_with_one() -> None:
    unknown = fact(0, -signal.SIGSEGV, ended_s=None)
    known = fact(1, 1, traceback(1, "ValueError: x"), ended_s=5.0)
    assert only(unknown, known).culprit_rank == 1


def test_only_symptoms_on_every_rank_blames_the_earliest_one() -> None:
    a = fact(0, 1, traceback(0, GLOO_RESET), ended_s=2.0)
    b = fact(1, 1, [NCCL_WATCHDOG], ended_s=1.0)
    d = only(a, b)
    assert d.culprit_rank == 1
    assert d.restart_helps == RestartHelps.YES


def test_succeeded_workers_and_stopped_workers_with_a_clean_log_are_ignored() -> None:
    stopped = fact(0, -signal.SIGTERM, ["step 14 loss 2.0"], state=WorkerState.STOPPED)
    ok = fact(1, 0, ["step 100 loss 1.0"], state=WorkerState.SUCCEEDED)
    failed = fact(2, 1, traceback(2, "KeyError: 'lr'"), ended_s=5.0)
    d = only(stopped, ok, failed)
    assert d.culprit_rank == 2
    assert d.symptoms == ()


def stamped(seconds: float, lines: Sequence[str], stream: str = "err") -> list[str]:
    """Lines as the rank log keeps them: `<ISO time read> <out|err> <text>`."""
    at = (T0 + timedelta(seconds=seconds)).isoformat()
    return [f"{at} {stream} {ln}" for ln in lines]


def test_the_rank_that_printed_its_error_first_is_the_culprit_even_if_it_exited_later() -> None:
    slow_teardown = fact(0, 1, stamped(1.0, traceback(0, "ValueError: bad batch")), ended_s=4.0)
    segv = fact(1, -signal.SIGSEGV, stamped(0.5, ["step 14 loss 2.2"], "out"), ended_s=2.0)
    d = only(segv, slow_teardown)
    assert d.culprit_rank == 0
    assert d.category == "user_code_error"


def test_a_stopped_rank_whose_error_was_read_before_detection_can_be_the_root_cause() -> None:
    stopped = fact(0, -signal.SIGTERM, stamped(1.0, traceback(0, "ValueError: bad batch")),
                   state=WorkerState.STOPPED, ended_s=4.0)
    victim = fact(1, 1, stamped(2.0, traceback(1, GLOO_RESET)), ended_s=2.5)
    d = diagnose_attempt([stopped, victim], T0 + timedelta(seconds=3))
    assert d is not None
    assert (d.culprit_rank, d.category) == (0, "user_code_error")
    assert any(s.rank == 1 for s in d.symptoms)


def test_log_lines_read_after_the_failure_was_detected_are_not_evidence() -> None:
    stopped = fact(0, -signal.SIGTERM, stamped(5.0, traceback(0, "ValueError: late")),
                   state=WorkerState.STOPPED, ended_s=6.0)
    victim = fact(1, 1, stamped(2.0, traceback(1, GLOO_RESET)), ended_s=2.5)
    d = diagnose_attempt([stopped, victim], T0 + timedelta(seconds=3))
    assert d is not None
    assert (d.culprit_rank, d.category) == (1, "network_or_rendezvous")


def test_a_stopped_rank_alone_is_no_failure() -> None:
    stopped = fact(0, -signal.SIGTERM, traceback(0, "ValueError: x"), state=WorkerState.STOPPED)
    assert diagnose_attempt([stopped]) is None


def test_stamped_log_lines_are_diagnosed_like_bare_ones() -> None:
    d = only(fact(1, 1, stamped(1.0, traceback(1, GLOO_RESET))))
    assert d.category == "network_or_rendezvous"
    assert d.evidence is not None and d.evidence.text.startswith("RuntimeError: [/__w/pytorch")


def test_an_attempt_without_a_failed_worker_has_no_diagnosis() -> None:
    facts = [fact(0, 0, state=WorkerState.SUCCEEDED),
             fact(1, -signal.SIGTERM, state=WorkerState.STOPPED),
             fact(2, None, state=WorkerState.RUNNING, ended_s=None)]
    assert diagnose_attempt(facts) is None


def test_a_diagnosis_serialises_its_verdict_and_culprit() -> None:
    d = only(fact(1, -signal.SIGKILL))
    out = d.to_dict()
    assert out["restart_helps"] == "maybe"
    assert out["culprit"] == {"rank": 1, "node": None, "frame": None, "in_library": None}
    assert out["symptoms"] == []


# --- which evidence wins within one rank --------------------------------------------------


def test_a_user_exception_beats_a_later_terminate_called_abort() -> None:
    tail = [*traceback(0, "ValueError: labels out of range"),
            "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
            "  what():  [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
            "op.preamble.length <= op.nbytes. 8 vs 4",
            "Aborted (core dumped)"]
    d = only(fact(0, -signal.SIGABRT, tail))
    assert d.category == "user_code_error"
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == "ValueError: labels out of range"


def test_an_nccl_watchdog_abort_is_diagnosed_as_a_collective_timeout() -> None:
    tail = [NCCL_WATCHDOG,
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread "
            "terminated with exception: [Rank 0] Watchdog caught collective operation timeout",
            "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:618 (most recent call first):"]
    d = only(fact(0, -signal.SIGABRT, tail))
    assert d.category == "nccl_timeout_or_hang"


def test_an_xid_79_line_beats_the_cuda_error_that_follows_it() -> None:
    tail = ["step 200 loss 1.9", XID_79,
            "RuntimeError: CUDA error: unspecified launch failure"]
    d = only(fact(3, -6, tail))
    assert d.category == "gpu_hardware"
    assert d.isolate_node is True


# --- SIGKILL: the OOM killer or a kill from outside -----------------------------------------


def test_a_sigkill_while_the_kernels_oom_kill_count_rose_is_a_host_oom() -> None:
    f = fact(1, -signal.SIGKILL, ["step 3 loss 1.0"]).model_copy(update={"oom_killed": True})
    d = only(f)
    assert (d.category, d.restart_helps, d.confidence) == ("host_oom", RestartHelps.MAYBE, 0.9)


def test_a_sigkill_without_an_oom_kill_is_a_kill_from_outside() -> None:
    f = fact(1, -signal.SIGKILL, ["step 3 loss 1.0"]).model_copy(update={"oom_killed": False})
    d = only(f)
    assert d.category == "killed_by_signal_unknown"
    # not "from outside the job": the launcher cannot tell who sent it (walk-through 16: an
    # injected fault, sent by the rank itself, read as an outside kill)
    assert "not by the kernel's OOM killer" in d.summary and "TRAINGUARD_FAULT" in d.advice


def test_a_sigkill_with_no_oom_information_is_likely_a_host_oom() -> None:
    d = only(fact(1, -signal.SIGKILL, ["step 3 loss 1.0"]))
    assert d.category == "host_oom" and d.confidence < 0.9


def test_a_harmless_import_warning_does_not_turn_a_kill_from_outside_into_a_user_error() -> None:
    tail = ["warning: fused kernels unavailable (ImportError: No module named 'apex'), "
            "using native", "step 7 loss 1.0"]
    f = fact(1, -signal.SIGKILL, tail).model_copy(update={"oom_killed": False})
    d = only(f)
    assert d.category == "killed_by_signal_unknown"
    assert d.restart_helps == RestartHelps.YES


def test_a_keyboard_interrupt_from_a_sigint_sent_from_outside_is_a_signal_not_a_bug() -> None:
    d = only(fact(0, -signal.SIGINT, [*traceback(0, "KeyboardInterrupt")]))
    assert d.category == "killed_by_signal_unknown"
    assert d.restart_helps == RestartHelps.YES


def test_a_rank_that_chose_to_exit_is_the_culprit_not_the_peer_its_exit_reset() -> None:
    """The walk-through's `exit:3@step=5,rank=0`: rank 1 then fails on the connection rank
    0's exit reset. Its line is what the exit did to it: the answer is rank 0's plain exit
    (`other`, no restart), not a network error on rank 1 read by the trained model."""
    d = diagnose_attempt([
        fact(0, 3, ["[rank0]: step 4 loss 2.1", "[rank0]: step 5 loss 2.0"], ended_s=0.0),
        fact(1, 1, traceback(1, GLOO_RESET_2_13, code="loss.backward()"), ended_s=0.4)])
    assert d is not None
    assert d.category == "other" and d.restart_helps == RestartHelps.NO
    assert d.culprit.rank == 0 and "code 3" in d.summary
