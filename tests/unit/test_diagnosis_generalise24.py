"""What the analysis reads beyond exact signatures (issue 17, twenty-fourth round, after the
twenty-eighth blind set): a CUDA error of out of memory in any capitalisation (PaddlePaddle's
legacy `Cuda Error:` in a glog check) and NCCL's `Failed to CUDA calloc` are a GPU OOM; the
verbs' `transport retry count(er) exceeded` (status 12, as UCX prints it) is NCCL's network
transport; OpenSSH refusing the login is the launch's configuration; a learning-rate scheduler
resumed over an optimizer whose state was not loaded is the checkpoint's resume; ssh refused on
another host's own port is a peer not up yet (restart yes), on this host or port 22 no sshd
(restart no). Every answer shows the line that decided it."""

from __future__ import annotations

from pathlib import Path

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.taxonomy import Category, RestartHelps


# heldout28's paddlespeech-296 (PaddlePaddle/PaddleSpeech issue 296): not a native crash
def test_paddles_cuda_error_out_of_memory_is_a_gpu_oom(tmp_path: Path) -> None:
    line = ("F1228 01:28:25.392861   173 hl_cuda_device.cc:399] Check failed: cudaSuccess == "
            "cudaStat (0 vs. 2) Cuda Error: out of memory")
    d = diagnose_text(tmp_path, line + "\n*** Check failure stack trace: ***\n"
                      "    @     0x7f3a1c2b4c5d  google::LogMessage::Fail()\n")
    assert d.category == Category.GPU_OOM
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and "Cuda Error: out of memory" in d.evidence.text


# heldout28's deepspeed-3827 (deepspeedai/DeepSpeed issue 3827): NCCL's internal error whose
# last error is its device allocation
def test_nccls_failed_cuda_calloc_is_a_gpu_oom(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "RuntimeError: NCCL error in: /opt/conda/conda-bld/pytorch_1670525541990/work/torch/"
        "csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, internal error, NCCL version 2.14.3\n"
        "ncclInternalError: Internal check failed.\nLast error:\n"
        "Failed to CUDA calloc async 1920 bytes\n"))
    assert d.category == Category.GPU_OOM
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and "Failed to CUDA calloc" in d.evidence.text


# heldout28's horovod-1390 (horovod/horovod issue 1390): UCX's mlx5 transport on RoCE
def test_transport_retry_count_exceeded_is_the_network_transport(tmp_path: Path) -> None:
    line = ("[ksgpu-v-051:51920:0:52950] ib_mlx5_log.c:139  Transport retry count exceeded on "
            "mlx5_0:1/RoCE (synd 0x15 vend 0x85 hw_synd 0/0)")
    d = diagnose_text(tmp_path, line + "\n==== backtrace (tid:  52950) ====\n"
                      " 0 0x0000000000047798 ucs_fatal_error_message()  ???:0\n")
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    assert d.restart_helps == RestartHelps.YES


# heldout28's gpt-neox-734 (EleutherAI/gpt-neox issue 734): pdsh's ssh without keys
def test_ssh_login_denied_is_the_configuration(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "172.17.0.2: Permission denied, please try again.\n"
        "172.17.0.2: mchorse@172.17.0.2: Permission denied (publickey,password).\n"
        "pdsh@6dca91c32bfd: 172.17.0.2: ssh exited with exit code 255\n"))
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO


# heldout28's bert-vits2-46 (fishaudio/Bert-VITS2 issue 46): torch's lr_scheduler message
def test_a_scheduler_resumed_without_the_optimizers_state_is_the_resume(tmp_path: Path) -> None:
    line = ("KeyError: \"param 'initial_lr' is not specified in param_groups[0] when resuming "
            "an optimizer\"")
    d = diagnose_text(tmp_path, (
        "Traceback (most recent call last):\n"
        '  File "train_ms.py", line 402, in <module>\n    run()\n'
        '  File "torch/optim/lr_scheduler.py", line 35, in __init__\n'
        "    raise KeyError(\"param 'initial_lr' is not specified \"\n" + line + "\n"))
    assert d.category == Category.CHECKPOINT_LOAD_ERROR
    assert d.restart_helps == RestartHelps.NO


# heldout28's horovod-504 and horovod-1226: the peer's sshd on its own port, not up yet
def test_ssh_refused_on_a_peers_own_port_is_worth_a_restart(tmp_path: Path) -> None:
    line = "ssh: connect to host 192.168.11.1 port 50000: Connection refused"
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.YES
    assert d.evidence is not None and d.evidence.text == line


# heldout3's deepspeedexamples-894: no sshd on this machine, the same on every start
def test_ssh_refused_on_localhost_port_22_is_not(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path,
                      "localhost: ssh: connect to host localhost port 22: Connection refused\n")
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.NO
