"""What the analysis reads beyond exact signatures (issue 17, eighteenth round, after the
twenty-second blind set): an exception whose message says NaN is numerical, however the code
words it; the CUDA driver API's `CUDA_ERROR_LAUNCH_FAILED` is a kernel's failure; c10d's
`Operation timed out!` is a collective's timeout; an env:// rendezvous variable no launcher
set is a launch mistake (PyTorch's message, or its raise where a paste stops); a resume
notice that found no checkpoint is no failed load; a line that only names Hugging Face or
wandb (a link in a warning) is no remote service's failure. Every answer shows the line that
decided it."""

from __future__ import annotations

from pathlib import Path

from tests.unit.helpers import diagnose_text, traceback_of
from trainguard.diagnosis.families import load_families
from trainguard.diagnosis.taxonomy import Category, RestartHelps


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


def test_the_cuda_driver_apis_launch_failure_is_a_kernels(tmp_path: Path) -> None:
    text = ("E tensorflow/stream_executor/cuda/cuda_driver.cc:1140] could not synchronize on "
            "CUDA context: CUDA_ERROR_LAUNCH_FAILED :: No stack trace available\n"
            "F tensorflow/core/common_runtime/gpu/gpu_util.cc:370] GPU sync failed\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.CUDA_KERNEL_ERROR
    assert d.evidence is not None and "CUDA_ERROR_LAUNCH_FAILED" in d.evidence.text


def test_c10ds_operation_timed_out_is_a_collectives_timeout(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "/espnet/espnet2/train/trainer.py", line 384, in train_one_epoch\n'
            "    torch.distributed.all_reduce(iterator_stop, ReduceOp.SUM)\n"
            '  File "/miniconda/envs/espnet/lib/python3.7/site-packages/torch/distributed/'
            'distributed_c10d.py", line 911, in all_reduce\n'
            "    work.wait()\n"
            "RuntimeError: Operation timed out!\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.evidence is not None and d.evidence.text == "RuntimeError: Operation timed out!"


def test_a_clients_operation_timed_out_without_the_bang_is_not_a_collectives(
        tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, traceback_of(
        "RuntimeError: Operation timed out after 30001 milliseconds with 0 bytes received"))
    assert d.category != Category.NCCL_TIMEOUT_OR_HANG


def test_an_env_rendezvous_variable_no_launcher_set_is_a_launch_mistake(
        tmp_path: Path) -> None:
    line = ("ValueError: Error initializing torch.distributed using env:// rendezvous: "
            "environment variable RANK expected, but not set")
    d = diagnose_text(tmp_path, traceback_of(line))
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


def test_a_paste_cut_at_the_env_rendezvous_raise_is_a_launch_mistake(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "train_WIP.py", line 11, in <module>\n'
            '    torch.distributed.init_process_group(backend="nccl", world_size=4)\n'
            '  File "/home/u/env/lib/python3.8/site-packages/torch/distributed/'
            'distributed_c10d.py", line 423, in init_process_group\n'
            "    store, rank, world_size = next(rendezvous_iterator)\n"
            '  File "/home/u/env/lib/python3.8/site-packages/torch/distributed/rendezvous.py", '
            "line 166, in _env_rendezvous_handler\n"
            '    raise _env_error("MASTER_ADDR")\n')
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.CONFIG_ERROR
    assert d.evidence is not None and "_env_error" in d.evidence.text


def test_a_resume_notice_that_found_no_checkpoint_is_no_failed_load(tmp_path: Path) -> None:
    text = ("nothing to restore. no checkpoint found.\n"
            'train evolution "0_flow1" ...\n'
            "start iteration 0\n"
            "Segmentation fault(core dumped)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.evidence is not None and "Segmentation fault" in d.evidence.text


def test_a_checkpoint_that_does_not_exist_is_still_a_failed_load(tmp_path: Path) -> None:
    line = "FileNotFoundError: Checkpoint /ckpt/step_100.pt not found"
    d = diagnose_text(tmp_path, traceback_of(line))
    assert d.category == Category.CHECKPOINT_LOAD_ERROR


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
