"""What the analysis reads beyond exact signatures (issue 17, second round): who reported a
kill, pastes that issue threads mangle, failure families of structures (the kernel's OOM
table, NCCL's error trace, a dead actor, a setting held to a bound, an HTTP error status),
an NPU's timeout as its collective hang, and the restart verdict's new rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.families import load_families
from trainguard.diagnosis.lines import split_prefix
from trainguard.diagnosis.restart import story_restart
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Category, Diagnosis, Evidence, FaultDomain, RestartHelps

# --- who reported the kill --------------------------------------------------------------------

MPIRUN = """Epoch 1/1
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
mpirun noticed that process rank 7 with PID 0 on node gpu3 exited on signal 9 (Killed).
"""


def test_a_kill_that_mpirun_reports_is_from_outside_and_names_its_rank(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, MPIRUN)
    assert (d.category, d.restart_helps) == (Category.KILLED_BY_SIGNAL_UNKNOWN, RestartHelps.YES)
    assert d.evidence is not None and d.evidence.line == 4 and d.culprit.rank == 7


@pytest.mark.parametrize("line", [
    "[2022-05-27T11:37:57.377] _job_complete: JobId=127441 WTERMSIG 9",
    "/tmp/slurmd/job603995/slurm_script: line 9:  4727 Killed ",
    "/var/spool/slurmd/job00191/slurm_script: line 28:  8156 Killed   python3 main.py",
])
def test_a_kill_that_slurm_reports_without_an_oom_kill_is_from_outside(
        tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, f"epoch 3 step 200 loss 1.2\n{line}\n")
    assert d.category == Category.KILLED_BY_SIGNAL_UNKNOWN
    assert d.evidence is not None and d.evidence.line == 2


def test_slurm_reports_its_own_oom_kills_and_torchrun_sigkill_stays_host_oom(
        tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "/var/spool/slurmd/job00191/slurm_script: line 28:  8156 Killed   python3 main.py\n"
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=191.batch cgroup.\n"))
    assert d.category == Category.HOST_OOM
    # (a binary under a path named slurm is no notice of Slurm's)
    d = diagnose_text(tmp_path, "ERROR:torch.distributed.elastic.multiprocessing.api:failed "
                      "(exitcode: -9) local_rank: 3 (pid: 812917) of binary: "
                      "/opt/slurm/envs/bin/python\n")
    assert d.category == Category.HOST_OOM


# --- pastes --------------------------------------------------------------------------------------


def test_a_paste_flattened_onto_one_line_still_shows_how_the_process_died(
        tmp_path: Path) -> None:
    flat = ("creating index... INFO: Start training " + "0%| | 0/90000 [00:00<?, ?it/s]" * 20
            + "Traceback (most recent call "
            "last): File \"launch.py\", line 218, in main cmd=process.args) "
            "subprocess.CalledProcessError: Command '['python', 'train_net.py']' died with "
            "<Signals.SIGSEGV: 11>.\n")
    d = diagnose_text(tmp_path, flat)
    # the launcher's notice decides (the line is longer than a context line keeps)
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert not (d.rule or "").startswith("family:") and d.confidence > 0.5
    assert d.evidence is not None and d.evidence.line == 1


@pytest.mark.parametrize(("raw", "text", "rank"), [
    ("> [rank3]: Killed", "Killed", 3),
    ("**AttributeError: 'Model' object has no attribute 'module'**",
     "AttributeError: 'Model' object has no attribute 'module'", None),
    ("\u201dmisc/ibvwrap.cc:280 NCCL WARN Call to ibv_create_qp failed\u201c",
     "misc/ibvwrap.cc:280 NCCL WARN Call to ibv_create_qp failed", None),
    ("a > b is `true`", "a > b is `true", None),
])
def test_markup_a_paste_wraps_around_a_line_is_dropped(raw: str, text: str,
                                                        rank: int | None) -> None:
    got = split_prefix(raw)
    assert (got.text, got.rank) == (text, rank)


# --- families of structures ----------------------------------------------------------------------

OOM_ROW = "[17798674.3745{}] [ {}]  1000 {} {} {} {}  {}  -998 {}\n"
OOM_TABLE = "".join(OOM_ROW.format(i, pid, pid, vm, rss, pt, swap, name)
                    for i, (pid, vm, rss, pt, swap, name) in enumerate([
                        (199244, 1907, 677, 49152, 0, "bash"),
                        (202779, 274650088, 243385180, 1957441536, 7930, "python"),
                        (202780, 33475461, 2529507, 25161728, 3314, "python")]))


def test_the_kernels_oom_task_table_alone_is_host_oom(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, OOM_TABLE)
    assert d.category == Category.HOST_OOM and d.rule == "family:host_oom"


def test_killed_in_markdown_at_the_end_of_a_paste_is_host_oom(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "iter 144 loss 0.92\n**Killed**\n")
    assert d.category == Category.HOST_OOM


def test_nccls_error_trace_in_its_network_layer_is_a_communication_error(
        tmp_path: Path) -> None:
    trace = "".join(f"h1: h1:10793:11394 [{g}] NCCL INFO {where} -> 2\n"
                    for g in (0, 1) for where in ("misc/socket.cc:564", "bootstrap.cc:270",
                                                  "init.cc:1303", "group.cc:64"))
    d = diagnose_text(tmp_path, trace)
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    fam = load_families()
    # an internal error (3) is what an abort leaves behind, not the network's failure
    assert Category.NCCL_COMMUNICATION_ERROR not in fam.scores(
        "NCCL INFO misc/socket.cc:863 -> 3")


def test_an_exception_that_says_an_actor_died_is_a_kill_from_outside(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "Traceback (most recent call last):\n"
        '  File "main_ppo.py", line 64, in main\n'
        "    ray.get(runner.run.remote(config))\n"
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this "
        "task.\n"))
    assert (d.category, d.restart_helps) == (Category.KILLED_BY_SIGNAL_UNKNOWN, RestartHelps.YES)


@pytest.mark.parametrize("message", [
    "AssertionError: Micro batch size per gpu: 0 has to be greater than 0",
    "ValueError: num_workers should be at least 1, got 0",
])
def test_a_setting_held_to_a_bound_it_misses_is_a_config_error(tmp_path: Path,
                                                               message: str) -> None:
    d = diagnose_text(tmp_path, (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 12, in <module>\n'
        "    main()\n"
        f"{message}\n"))
    assert (d.category, d.restart_helps) == (Category.CONFIG_ERROR, RestartHelps.NO)


def test_a_hub_answering_with_an_http_error_status_is_a_remote_service(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "Traceback (most recent call last):\n"
        '  File "tok.py", line 3, in <module>\n'
        "    load()\n"
        "huggingface_hub.errors.HfHubHTTPError: 504 Server Error: Gateway Time-out for url: "
        "https://huggingface.co/api/models/org/tokenizer\n"))
    assert d.category == Category.OTHER


@pytest.mark.parametrize("line", [
    "zgiot:1183664:1184669 [0] NCCL INFO socketPollConnect: connect returned No route to "
    "host, retrying (26/34) after sleep for 2600 msec",
    "RuntimeError: [/src/third_party/gloo/gloo/transport/tcp/pair.cc:611] Connect timeout "
    "[172.17.27.13]:27023",
])
def test_a_collective_librarys_own_connect_failing_is_a_communication_error(
        tmp_path: Path, line: str) -> None:
    assert diagnose_text(tmp_path, f"{line}\n").category == Category.NCCL_COMMUNICATION_ERROR


# --- NPU timeouts ---------------------------------------------------------------------------------


def test_an_npu_stream_or_task_timeout_is_its_collective_hang(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "EE9999: Inner Error!\n"
        "EE9999  fftsplus task execute failed, dev_id=7, stream_id=7, task_id=5990, "
        "err_type=13[hccl fftsplus timeout][FUNC:GetError][FILE:stream.cc][LINE:1512]\n"
        "EH9999: Inner Error!\n"
        "EH9999  wait for compute device to finish failed, runtime result = 107020.\n"))
    assert (d.category, d.restart_helps) == (Category.NCCL_TIMEOUT_OR_HANG, RestartHelps.YES)
    assert d.evidence is not None and d.evidence.line == 2  # the detail, not the header


def test_a_device_exception_still_wins_over_the_timeout_it_causes(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "EH9999: Inner Error!\n"
        "        rtDeviceSynchronizeWithTimeout execute failed, reason=[aicpu exception]\n"
        "EH9999  wait for compute device to finish failed, runtime result = 107020.\n"))
    assert d.category == Category.NPU_HARDWARE_OR_DRIVER
    d = diagnose_text(tmp_path, (
        "EH9999: 2024-06-19-23:19:23.433.674  wait for compute device to finish failed, "
        "runtime result = 507018.\n"
        "EH9999: Inner Error!\n"
        "[Error]: The execution of the internal task times out.\n"))
    assert d.category == Category.NPU_HARDWARE_OR_DRIVER


# --- the restart verdict's new rows ------------------------------------------------------------


def _d(cat: Category, text: str) -> Diagnosis:
    return Diagnosis(cat, FaultDomain.NETWORK, RestartHelps.YES, text, "advice.",
                     evidence=Evidence("f.log", 1, text))


@pytest.mark.parametrize(("cat", "text", "verdict"), [
    (Category.PORT_CONFLICT, "[W socket.cpp:401] [c10d] The server socket has failed to bind "
     "to [::]:22 (errno: 98 - Address already in use).", RestartHelps.NO),
    (Category.PORT_CONFLICT, "[W socket.cpp:426] [c10d] The server socket has failed to bind "
     "to [::]:29500 (errno: 98 - Address already in use).", RestartHelps.YES),
    (Category.PORT_CONFLICT, "[E socket.cpp:401] 98: Address already in use", RestartHelps.YES),
    (Category.NETWORK_OR_RENDEZVOUS, "[c10d] The client socket has failed to connect to "
     "[::ffff:0.0.0.5]:40323 (errno: 110 - Connection timed out).", RestartHelps.NO),
    # (a client that *failed* to connect at all says no since the fifth round, whatever the
    # address: tests/unit/test_diagnosis_generalise5.py; one that timed out waiting says yes)
    (Category.NETWORK_OR_RENDEZVOUS, "[c10d] The client socket has timed out after 60s while "
     "trying to connect to (10.0.0.5, 40323).", RestartHelps.YES),
    (Category.NETWORK_OR_RENDEZVOUS, "The server socket has failed to listen on 0.0.0.0:29500",
     RestartHelps.YES),
])
def test_a_well_known_port_or_a_number_taken_for_a_host_says_no(
        cat: Category, text: str, verdict: RestartHelps) -> None:
    assert story_restart(_d(cat, text), []).restart_helps == verdict


def test_more_workers_than_the_world_at_the_store_barrier_is_stale_and_says_no(
        tmp_path: Path) -> None:
    line = ("RuntimeError: Timed out initializing process group in store based barrier on "
            "rank: 0, for key: store_based_barrier_key:1 (world_size={w}, worker_count={c}, "
            "timeout=0:02:00)\n")
    stale = diagnose_text(tmp_path, line.format(w=2, c=4))
    assert (stale.category, stale.restart_helps) == (Category.NETWORK_OR_RENDEZVOUS,
                                                     RestartHelps.NO)
    short = diagnose_text(tmp_path, line.format(w=2048, c=1792))
    assert short.restart_helps == RestartHelps.YES


def test_a_rate_limit_may_still_hold_when_the_job_comes_back(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "requests.exceptions.HTTPError: 429 Client Error: Too Many "
                      "Requests for URL: https://huggingface.co/x/resolve/main/config.json\n")
    assert (d.category, d.restart_helps) == (Category.OTHER, RestartHelps.MAYBE)


# --- host memory that grows until the log stops --------------------------------------------------


def test_host_memory_that_grows_until_the_log_stops_is_host_oom(tmp_path: Path) -> None:
    rss = (5.11, 5.11, 46.5, 105.6, 161.1, 212.0)
    log = "".join(f"TRAIN Batch 0/{185100 + 100 * i} loss 4.5 rank 0 RSS MEM USE: {g}G\n"
                  for i, g in enumerate(rss))
    d = diagnose_text(tmp_path, log, "rank0.log")
    assert (d.category, d.rule) == (Category.HOST_OOM, "family:host_oom")
    assert d.evidence is not None and d.evidence.line == 6 and d.confidence <= 0.45
    assert "5.1 to 212.0 GiB" in d.advice


@pytest.mark.parametrize("reading", ["RSS MEM USE: {g:.1f}G", "GPU mem {g:.1f} GB"])
def test_memory_that_stays_flat_or_is_the_gpus_says_nothing(tmp_path: Path,
                                                             reading: str) -> None:
    flat = "".join(f"step {i} loss 2.0 {reading.format(g=20.0 + i * 0.1)}\n" for i in range(8))
    grows = "".join(f"step {i} loss 2.0 GPU mem {3.0 * 2 ** i:.1f} GB\n" for i in range(8))
    for text in (flat, grows):
        p = tmp_path / "rank0.log"
        p.write_text(text, encoding="utf-8")
        assert diagnose_paths([p]).diagnosis is None
