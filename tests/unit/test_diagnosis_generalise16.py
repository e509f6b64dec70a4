"""What the analysis reads beyond exact signatures (issue 17, sixteenth round, after the
twentieth blind set): a distributed call with no process group is a program or configuration
mistake, not the rendezvous; an INFO line that names no failure is not read by the failure
families either, while a loss grown past any trained value is an exploded loss; an attention
kernel that `only supports` newer GPUs is the configuration's; glog's fatal message above its
`Check failure stack trace` says why the process aborted, and a gRPC deadline exceeded is the
network's. Every answer shows the line that decided it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text, traceback_of
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Category, RestartHelps


def test_a_distributed_call_with_no_process_group_is_a_configuration_mistake(
        tmp_path: Path) -> None:
    line = ("RuntimeError: Default process group has not been initialized, please make sure "
            "to call init_process_group.")
    text = ('  File "/opt/conda/lib/python3.8/site-packages/torch/distributed/'
            'distributed_c10d.py", line 358, in _get_default_group\n'
            '    raise RuntimeError("Default process group has not been initialized, "\n'
            f"{line}\n")
    d = diagnose_text(tmp_path, traceback_of(text.rstrip("\n")))
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


def test_a_process_group_that_fails_to_set_up_stays_the_rendezvous(tmp_path: Path) -> None:
    line = ("RuntimeError: Gloo connectFullMesh failed with "
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error")
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.NETWORK_OR_RENDEZVOUS


def test_an_info_line_that_names_no_failure_is_no_familys_evidence(tmp_path: Path) -> None:
    # paddledetection#3326: an INFO line of loaded weights was read as a checkpoint's problem;
    # the losses that explode (no NaN yet) are what the log shows
    text = (
        "[06/08 16:58:10] ppdet.utils.checkpoint INFO: Finish loading model weights: "
        "/home/u/.cache/paddle/weights/ResNet50_cos_pretrained.pdparams\n"
        "[06/08 16:58:12] ppdet.engine INFO: Epoch: [0] [   0/3308] learning_rate: 0.000025 "
        "loss_rpn_cls: 0.698832 loss_bbox_reg: 0.000154 loss: 2.241040 eta: 13:33:58\n"
        "[06/08 16:58:17] ppdet.engine INFO: Epoch: [0] [  20/3308] learning_rate: 0.000030 "
        "loss_rpn_cls: 0.695908 loss_bbox_reg: 8035386370816811357582655488.000000 "
        "loss: 8035386370816811357582655488.000000 eta: 3:18:52\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NUMERICAL
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and "8035386370816811357582655488" in d.evidence.text


def test_an_info_line_alone_of_loaded_weights_is_no_checkpoint_error(tmp_path: Path) -> None:
    text = ("[06/08 16:58:10] ppdet.utils.checkpoint INFO: Finish loading model weights: "
            "/data/weights/model_final.pdparams\n"
            "[06/08 16:58:12] ppdet.engine INFO: Epoch: [0] [   0/3308] loss: 2.241040\n")
    p = tmp_path / "console.log"
    p.write_text(text, encoding="utf-8")
    d = diagnose_paths([p]).diagnosis
    assert d is None or d.category != Category.CHECKPOINT_LOAD_ERROR


def test_an_info_line_that_names_lame_workers_still_decides(tmp_path: Path) -> None:
    line = ("INFO:tensorflow:ShutdownHook: lame workers found: "
            "HeartbeatManager(/job:worker/replica:0/task:0/device:CPU:0)")
    d = diagnose_text(tmp_path, "INFO:tensorflow:training step 1200\n" + line + "\n")
    assert d.category == Category.KILLED_BY_SIGNAL_UNKNOWN
    assert d.evidence is not None and d.evidence.text == line


@pytest.mark.parametrize("line", [
    "RuntimeError: FlashAttention only supports Ampere GPUs or newer.",
    "RuntimeError: this attention kernel only supports sm80 GPUs and newer (flash_attn)",
])
def test_an_attention_kernel_that_only_supports_newer_gpus_is_the_configurations(
        tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, traceback_of(line))
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


def test_glogs_fatal_message_says_why_the_process_aborted(tmp_path: Path) -> None:
    # Paddle's parameter-server client (paddle#12537): the F line, glog's check trace, abort
    fatal = ("F0720 09:45:08.417428   591 grpc_client.cc:276] Send name:[fc_0.b_0@GRAD.trainer_1]"
             ", ep:[ps1.paddlepaddle.com:6174] meets grpc error:Deadline Exceeded")
    text = (f"{fatal}\n*** Check failure stack trace: ***\n"
            "    @     0x7f69cdad679d  google::LogMessage::Fail()\n"
            "    @     0x7f69cdada24c  google::LogMessage::SendToLog()\n"
            "    @     0x7f6a1958841d  clone\n"
            "Aborted (core dumped)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.YES
    assert d.subcategory == "glog_fatal"
    assert d.evidence is not None and d.evidence.text == fatal
    assert any("Check failure stack trace" in s.text for s in d.symptoms)


def test_a_check_failure_with_no_fatal_message_stays_an_abort(tmp_path: Path) -> None:
    text = ("*** Check failure stack trace: ***\n"
            "    @     0x7f69cdad679d  google::LogMessage::Fail()\n"
            "Aborted (core dumped)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SEGFAULT_OR_ABORT
