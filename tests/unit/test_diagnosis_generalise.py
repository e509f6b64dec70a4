"""What the analysis reads beyond exact signatures (issue 17's tuning rounds 2 to 24): the
cases that do more than diagnose one log. Those that diagnose one log and check its answer are
data, in tests/data/diagnosis/snippets.yaml (run by tests/unit/test_diagnosis_snippets.py),
with what each round taught; here stay, by round, the cases that read two logs, a log that
may get no answer at all, or the parts of the analysis alone (the restart verdict's rows, the
exit notices, the line prefixes a paste wraps around a line, the failure families' scores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text, diagnosis_or_none, traceback_of
from trainguard.diagnosis.exit_notices import exit_code
from trainguard.diagnosis.families import load_families
from trainguard.diagnosis.lines import split_prefix
from trainguard.diagnosis.restart import story_restart
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Category, Diagnosis, Evidence, FaultDomain, RestartHelps

# --- round 2 --------------------------------------------------------------------------------------


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
    # address: a_store_client_that_cannot_connect_at_all_does_not_restart in
    # tests/data/diagnosis/snippets.yaml; one that timed out waiting says yes)
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


@pytest.mark.parametrize("reading", ["RSS MEM USE: {g:.1f}G", "GPU mem {g:.1f} GB"])
def test_memory_that_stays_flat_or_is_the_gpus_says_nothing(tmp_path: Path,
                                                             reading: str) -> None:
    flat = "".join(f"step {i} loss 2.0 {reading.format(g=20.0 + i * 0.1)}\n" for i in range(8))
    grows = "".join(f"step {i} loss 2.0 GPU mem {3.0 * 2 ** i:.1f} GB\n" for i in range(8))
    for text in (flat, grows):
        p = tmp_path / "rank0.log"
        p.write_text(text, encoding="utf-8")
        assert diagnose_paths([p]).diagnosis is None


# --- round 3 --------------------------------------------------------------------------------------


def _cuda(text: str) -> Diagnosis:
    return Diagnosis(Category.CUDA_KERNEL_ERROR, FaultDomain.FRAMEWORK, RestartHelps.MAYBE,
                     text, "advice.", evidence=Evidence("f.log", 1, text))


@pytest.mark.parametrize("text,want", [
    ("RuntimeError: CUDA error: misaligned address", RestartHelps.NO),
    ("what():  CUDA error: misaligned address (insert_events at alloc.cpp:764)", RestartHelps.NO),
    # a warning printed while tearing down is no verdict on the inputs
    ("Warning: CUDA warning: misaligned address (function destroyEvent)", RestartHelps.MAYBE),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", RestartHelps.MAYBE),
])
def test_a_misaligned_address_repeats(text: str, want: RestartHelps) -> None:
    d = story_restart(_cuda(text), [])
    assert d.restart_helps == want
    assert want == RestartHelps.MAYBE or "Restart helps: no" in d.advice


# --- round 4 --------------------------------------------------------------------------------------


def test_an_illegal_instruction_says_no() -> None:
    d = Diagnosis(Category.SEGFAULT_OR_ABORT, FaultDomain.FRAMEWORK, RestartHelps.MAYBE, "x",
                  "advice.", evidence=Evidence(
                      "console.log", 1, "mpirun noticed that process rank 0 with PID 7 on node "
                      "n1 exited on signal 4 (Illegal instruction)."))
    assert story_restart(d, []).restart_helps == RestartHelps.NO
    other = Diagnosis(Category.SEGFAULT_OR_ABORT, FaultDomain.FRAMEWORK, RestartHelps.MAYBE,
                      "x", "advice.", evidence=Evidence("console.log", 1,
                                                        "Fatal Python error: Segmentation "
                                                        "fault"))
    assert story_restart(other, []).restart_helps == RestartHelps.MAYBE


# --- round 5 --------------------------------------------------------------------------------------


def test_an_npu_operator_without_a_binary_is_an_installation_problem(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "RuntimeError: call aclnnMul failed, detail:EZ9999: Inner Error!\n"
        "EZ9999: 2025-01-01-00:00:00.000.000  Op Mul does not have any binary.\n"))
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.evidence is not None and d.evidence.line == 2
    # the header alone still decides: an operator error that repeats
    d = diagnose_text(tmp_path, "RuntimeError: call aclnnMul failed, detail:EZ9999: Inner "
                                "Error!\n")
    assert d.category == Category.NPU_HARDWARE_OR_DRIVER and d.restart_helps == RestartHelps.NO


@pytest.mark.parametrize("text,code", [
    ("Process finished with exit code -1073741819 (0xC0000005)", -11),
    ("Process finished with exit code -1073741795 (0xC000001D)", -4),
    ("exit code 0xc0000409", -6),
    ("Process finished with exit code 3221225725", -11),
    ("Process finished with exit code 1", None),
])
def test_windows_crash_codes_are_exit_notices(text: str, code: int | None) -> None:
    assert exit_code(text) == (None, code)


def _watchdog(rank: int, seq: int, op: str) -> str:
    return (f"[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=8, NumelOut=8, "
            "Timeout(ms)=600000) ran for 600018 milliseconds before timing out.\n")


def test_a_desync_is_different_works_at_one_seqnum(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, _watchdog(0, 90, "ALLREDUCE") + _watchdog(1, 90, "BROADCAST"))
    assert d.restart_helps == RestartHelps.NO
    # one rank a collective behind the other: a straggler, not a different program
    d = diagnose_text(tmp_path, _watchdog(0, 90, "ALLREDUCE") + _watchdog(1, 91, "BROADCAST"))
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG and d.restart_helps == RestartHelps.YES


# --- round 6 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,code", [
    ("  host      : node-7\n  rank      : 3 (local_rank: 3)exitcode  : -9 (pid: 123)\n", -9),
    ("rank: 1 (local_rank: 1) exitcode: -6 (pid: 42) error_file: <N/A>", -6),
    ("exitcode: 1 (pid: 7)", 1),
    # a word that merely ends in `exitcode` is none
    ("myexitcode: 3", None),
])
def test_torchruns_exit_code_in_a_paste_that_ran_its_fields_together(text: str,
                                                                      code: int | None) -> None:
    line = text.splitlines()[-1]
    assert exit_code(line) == (None, code)


# --- round 7 --------------------------------------------------------------------------------------


def test_physical_interfaces_alone_are_no_answer(tmp_path: Path) -> None:
    p = tmp_path / "console.log"
    p.write_text("NCCL INFO NET/Socket : Using\n[0]eth0:10.1.0.7<0>\n[1]ib0:10.2.0.7<0>\n",
                 encoding="utf-8")
    assert diagnose_paths([p]).diagnosis is None


# --- round 8 --------------------------------------------------------------------------------------


def test_a_traceback_cut_in_another_wait_is_no_loaders(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "serve.py", line 30, in <module>\n'
            "    job = jobs.get()\n"
            '  File "/usr/lib/python3.8/queue.py", line 170, in get\n'
            "    self.not_empty.wait()\n"
            '  File "/usr/lib/python3.8/threading.py", line 302, in wait\n'
            "    waiter.acquire()\n")
    d = diagnosis_or_none(tmp_path, "waiting for jobs\n" + text)
    assert d is None or d.category != Category.DATALOADER_WORKER_CRASH


# --- round 9 --------------------------------------------------------------------------------------


def test_host_memory_with_room_left_is_no_oom(tmp_path: Path) -> None:
    text = ("[INFO] CPU Virtual Memory:  used = 30.1 GB, percent = 48.0%\n"
            "[INFO] CPU Virtual Memory:  used = 40.9 GB, percent = 61.5%\n"
            "[INFO] initializing optimizer states\n")
    d = diagnosis_or_none(tmp_path, text)
    assert d is None or d.category != Category.HOST_OOM


# --- round 12 -------------------------------------------------------------------------------------


def test_vscodes_exception_line_gives_way_to_its_message(tmp_path: Path) -> None:
    message = "CUDA error: no kernel image is available for execution on the device"
    text = ("Exception has occurred: RuntimeError\n" + message + "\n"
            '  File "/src/model/ops.py", line 60, in forward\n'
            "    out = ext.forward(x)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.evidence is not None and d.evidence.text == message
    assert d.symptoms and d.symptoms[0].text.startswith("Exception has occurred:")


# --- round 14 -------------------------------------------------------------------------------------


def test_a_tensor_that_does_not_fit_on_the_cpu_device_is_host_memory(tmp_path: Path) -> None:
    line = ("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
            "tensor with shape[4096,32000] and type float on "
            "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu")
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.HOST_OOM
    assert d.restart_helps == RestartHelps.NO
    gpu = line.replace("device:CPU:0 by allocator mklcpu", "device:GPU:1 by allocator GPU_1_bfc")
    (tmp_path / "g").mkdir()
    assert diagnose_text(tmp_path / "g", gpu + "\n").category == Category.GPU_OOM


# --- round 15 -------------------------------------------------------------------------------------


def test_torchruns_newer_exit_notice_is_an_exit(tmp_path: Path) -> None:
    line = ("[2026-03-30 19:24:42,731] torch.distributed.elastic.multiprocessing.api: [ERROR] "
            "failed (exitcode: -11) for binary located at /opt/conda/bin/python3.10 with "
            "local_rank: 3 (process ID: 71)")
    d = diagnose_text(tmp_path, "step 2465/50000\n" + line + "\n")
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.culprit_rank == 3
    # SIGKILL without an OOM line, from torchrun: host memory, as the older wording
    killed = line.replace("-11", "-9").replace("[2026", "[node-master-0] [2026")
    (tmp_path / "k").mkdir()
    d = diagnose_text(tmp_path / "k", killed + "\n")
    assert d.category == Category.HOST_OOM
    assert d.evidence is not None and "exitcode: -9" in d.evidence.text


# --- round 16 -------------------------------------------------------------------------------------


def test_an_info_line_alone_of_loaded_weights_is_no_checkpoint_error(tmp_path: Path) -> None:
    text = ("[06/08 16:58:10] ppdet.utils.checkpoint INFO: Finish loading model weights: "
            "/data/weights/model_final.pdparams\n"
            "[06/08 16:58:12] ppdet.engine INFO: Epoch: [0] [   0/3308] loss: 2.241040\n")
    d = diagnosis_or_none(tmp_path, text)
    assert d is None or d.category != Category.CHECKPOINT_LOAD_ERROR


# --- round 17 -------------------------------------------------------------------------------------


def test_a_memory_error_with_a_message_or_none_is_still_the_hosts(tmp_path: Path) -> None:
    for line in ("MemoryError", "MemoryError: Unable to allocate 6.41 GiB for an array"):
        d = diagnose_text(tmp_path, traceback_of(line))
        assert d.category == Category.HOST_OOM, line


# --- round 18 -------------------------------------------------------------------------------------


def test_an_exception_whose_message_says_nan_is_numerical(tmp_path: Path) -> None:
    for line in ("ValueError:Network outputs is NAN! Stop Training",
                 "AssertionError: Rank 3: found NaN in local grad norm in backwards pass."):
        d = diagnose_text(tmp_path, traceback_of(line))
        assert d.category == Category.NUMERICAL, line
        assert d.restart_helps == RestartHelps.NO
        assert d.evidence is not None and d.evidence.text == line


def test_a_nan_that_is_not_the_word_stays_the_codes(tmp_path: Path) -> None:
    # `nan` inside another word, and a lower-case `nan` key, name no NaN value
    for line in ("ValueError: unknown mode 'nanny'", "KeyError: 'nan'"):
        d = diagnose_text(tmp_path, traceback_of(line))
        assert d.category == Category.USER_CODE_ERROR, line


def test_a_warning_that_links_to_hugging_face_names_no_remote_service_failure() -> None:
    # transformers' tokenizer warning links to a pull request on github.com/huggingface: a
    # name, not a service that failed; alone it took the answer `other` and kept the model
    # from reading a host OOM while checkpoint shards load (LISA-33)
    fam = load_families()
    warning = ("You are using the legacy behaviour of the <class 'transformers.models.llama."
               "tokenization_llama.LlamaTokenizer'>. This means that tokens that come after "
               "special tokens will not be properly handled. We recommend you to read the "
               "related pull request available at https://github.com/huggingface/transformers"
               "/pull/24565")
    assert Category.OTHER not in fam.scores(warning)
    for failed in ("'(MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', port=443)\"), "
                   "'(Request ID: 5b2c)')' thrown while requesting GET https://huggingface.co/"
                   "datasets/monology/pile-uncopyrighted/resolve/main/train/14.jsonl.zst",
                   "Exception: The wandb backend process has shutdown"):
        assert fam.scores(failed).get(Category.OTHER, 0.0) >= 2.5, failed


# --- round 20 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [
    "Abandon de l'entraînement demandé par l'utilisateur",
    "Morto il processo di valutazione, riprendo",
    "中止条件を確認しています",
])
def test_common_words_of_the_locales_are_no_crash(tmp_path: Path, line: str) -> None:
    d = diagnosis_or_none(tmp_path, "epoch 1 step 20 loss 0.41\n" + line + "\n")
    assert d is None or d.evidence is None or d.evidence.text.strip() != line


# --- round 23 -------------------------------------------------------------------------------------


def test_tensorflows_pci_bus_id_is_no_hardware_fault() -> None:
    fam = load_families()
    line = ("Created TensorFlow device (/job:localhost/replica:0/task:0/device:GPU:0 with 7524 "
            "MB memory) -> physical GPU (device: 0, name: Vega 10 XL/XT, pci bus id: "
            "0000:03:00.0)")
    assert Category.GPU_HARDWARE not in fam.scores(line)
    # the kernel's PCIe error report still is (cases/' returnn-1486, heldout7's gpu-burn-1)
    assert Category.GPU_HARDWARE in fam.scores(
        "pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
        "type=Transaction Layer, id=0010(Receiver ID)")


# --- round 44 -------------------------------------------------------------------------------------


def test_each_rank_announced_once_decides_nothing(tmp_path: Path) -> None:
    # Lightning's rank announcements decide only as a pair on one rank (diagnosis/ranks.py):
    # every rank once is a start that went well, and the exception after it decides
    d = diagnosis_or_none(tmp_path, "initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/2\n"
                          "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/2\n"
                          "RuntimeError: Expected all tensors to be on the same device\n")
    assert d is not None and d.category == Category.USER_CODE_ERROR
    assert d.evidence is not None and "GLOBAL_RANK" not in d.evidence.text
    d = diagnosis_or_none(tmp_path, "initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/2\n"
                          "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/2\n")
    assert d is None or d.category != Category.CONFIG_ERROR
