"""What the analysis reads beyond exact signatures (issue 17, seventh round, after the tenth
blind set): a wait on a peer that ran out while the connection stood, a stall report of
ranks waiting for the rest, a traceback cut where a rank waits for the others, NCCL's
socket transport on a virtual interface, an interface the machine does not have, and the
restart verdicts that follow from them. The lines are worded unlike the cases they were
learnt from: the structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Category, RestartHelps


@pytest.mark.parametrize("text", [
    # a store's socket that waited for its peer's answer past the timeout
    "[W1203 09:12:01.000 socket.cpp:470] [c10d] waitForInput: recv from 10.0.0.3:29400 "
    "timed out after 600000ms\n",
    "[store] waiting for data from the peer on fd 12 returned 0, likely a timeout\n",
])
def test_a_wait_on_a_peer_that_ran_out_is_a_hang(tmp_path: Path, text: str) -> None:
    d = diagnose_text(tmp_path, "epoch 1 step 40 loss 2.1\n" + text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.evidence is not None and "time" in d.evidence.text


@pytest.mark.parametrize("text", [
    # a stall report, in words of its own
    "W stall_check.cc:40] Some collectives were submitted by a subset of ranks only; ranks "
    "2, 5 are stalled for more than 120 seconds\n",
    # a rank's line of such a report: the collectives' tensors it waits in, nothing else
    "5: [grad/Allgather_layer3_weight_0, grad/Allgather_layer3_bias_0]\n",
])
def test_a_stall_report_of_ranks_waiting_for_the_rest_is_a_hang(tmp_path: Path,
                                                                  text: str) -> None:
    d = diagnose_text(tmp_path, "iter 900 lr 0.001 loss 0.42\n" + text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG


def test_a_traceback_cut_where_a_rank_waits_for_the_others_is_a_hang(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "finetune.py", line 88, in <module>\n'
            "    build_cache(cfg)\n"
            '  File "finetune.py", line 51, in build_cache\n'
            "    with acc.local_main_process_first():\n"
            '  File "/usr/lib/python3.11/contextlib.py", line 137, in __enter__\n'
            "    return next(self.gen)\n")
    d = diagnose_text(tmp_path, "loading shards\n" + text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.evidence is not None and "main_process_first" in d.evidence.text


def test_a_hang_while_a_rank_prepares_the_data_does_not_restart(tmp_path: Path) -> None:
    text = ("Packing sequences (num_proc=32):  97%|#########7| 90211/93000 [59:58<01:40]\n"
            "[W1203 10:00:02.1 socket.cpp:470] [c10d] waitForInput: socket to "
            "master:29500 timed out after 3600000ms\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.restart_helps == RestartHelps.NO


def test_a_hang_without_data_preparation_keeps_its_default(tmp_path: Path) -> None:
    text = ("train: 40%|####      | 400/1000 [10:00<15:00]\n"
            "[W1203 10:00:02.1 socket.cpp:470] [c10d] waitForInput: socket to "
            "master:29500 timed out after 600000ms\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.restart_helps == RestartHelps.YES


def test_nccls_socket_transport_on_a_virtual_interface(tmp_path: Path) -> None:
    text = ("node2:311:311 [0] NCCL INFO NET/Socket : Using\n"
            "[0]eth0:10.1.0.7<0>\n"
            "[1]docker0:172.17.0.1<0>\n"
            "[2]virbr0:192.168.122.1<0>\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    assert d.restart_helps == RestartHelps.NO


def test_physical_interfaces_alone_are_no_answer(tmp_path: Path) -> None:
    p = tmp_path / "console.log"
    p.write_text("NCCL INFO NET/Socket : Using\n[0]eth0:10.1.0.7<0>\n[1]ib0:10.2.0.7<0>\n",
                 encoding="utf-8")
    assert diagnose_paths([p]).diagnosis is None


def test_an_interface_the_machine_does_not_have_is_the_networks(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "step 0\nRuntimeError: [tcp/device.cc:90] could not find "
                                "address for interface ens9f0\n")
    assert d.category == Category.NETWORK_OR_RENDEZVOUS


def test_an_abort_that_an_uncaught_exception_explains_takes_its_cause(tmp_path: Path) -> None:
    text = ("terminate called after throwing an instance of 'tcp::SocketError'\n"
            "  what():  [transport/tcp/pair.cc:310] connect [10.4.0.2]:41000: Connection "
            "refused\n"
            "Aborted (core dumped)\n")
    d = diagnose_text(tmp_path, "init process group\n" + text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.evidence is not None and "what():" in d.evidence.text
    assert any("Aborted" in s.text for s in d.symptoms)


def test_an_abort_for_an_interface_the_machine_lacks_does_not_restart(tmp_path: Path) -> None:
    text = ("[3]<stderr>:terminate called after throwing an instance of 'net::Error'\n"
            "[3]<stderr>:  what():  [device.cc:51] cannot find address for interface "
            "eno7\n"
            "[3]<stderr>:Fatal Python error: Aborted\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.NO


def test_an_abort_whose_exception_names_no_cause_stays_an_abort(tmp_path: Path) -> None:
    text = ("terminate called after throwing an instance of 'std::runtime_error'\n"
            "  what():  bad optional access\n"
            "Aborted (core dumped)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SEGFAULT_OR_ABORT


def test_a_dataloader_bus_error_however_the_paste_broke_the_line(tmp_path: Path) -> None:
    text = ("RuntimeError: DataLoader worker (pid 913) is killed by signal: Bus\n"
            "error. It is possible that the workers ran out of shared memory.\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SHARED_MEMORY


def test_a_lookup_raised_where_a_state_dict_is_loaded_is_the_checkpoints(
        tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "resume.py", line 60, in <module>\n'
            "    scheduler.load_state_dict(saved['lr_scheduler'])\n"
            "KeyError: 'lr_scheduler'\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.CHECKPOINT_LOAD_ERROR
    assert d.restart_helps == RestartHelps.NO


def test_a_lookup_raised_elsewhere_stays_the_codes(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "train.py", line 12, in <module>\n'
            "    lr = row['learning_rate']\n"
            "KeyError: 'learning_rate'\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.USER_CODE_ERROR


def test_sizes_that_do_not_match_in_an_optimizers_step_are_the_checkpoints(
        tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "fit.py", line 210, in train_epoch\n'
            "    opt.step()\n"
            '  File "/opt/py/lib/python3.9/site-packages/torch/optim/adam.py", line 120, in '
            "step\n"
            "    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)\n"
            "RuntimeError: The size of tensor a (768) must match the size of tensor b (1024) "
            "at non-singleton dimension 0\n")
    d = diagnose_text(tmp_path, "resumed from step 5000\n" + text)
    assert d.category == Category.CHECKPOINT_LOAD_ERROR


def test_a_tensor_ops_numbered_invalid_argument_is_not_the_configs(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "model.py", line 33, in forward\n'
            "    h = torch.cat([a, b], 1)\n"
            "RuntimeError: invalid argument 0: Sizes of tensors must match except in "
            "dimension 1\n")
    d = diagnose_text(tmp_path, text)
    assert d.category != Category.CONFIG_ERROR
