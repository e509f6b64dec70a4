"""Walk-through 22's diagnosis findings: with trainguard installed from a source tree (`pip
install -e`, as the README says) a failure inside `Trainer.train` was blamed on trainguard's
own integration frame (src/trainguard/integrations/hf.py) instead of the user's line; a
UTF-16 log holding a CUDA OOM gave 'no failure found', and a binary file gave the same with
no word that it was not text."""

from __future__ import annotations

import os
from pathlib import Path

from tests.unit.helpers import diagnose_text, tg, traceback_of
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Category

HF_EDITABLE = """Traceback (most recent call last):
  File "/home/u/proj/hf_train.py", line 41, in <module>
    trainer.train()
  File "/work/main/src/trainguard/integrations/hf.py", line 116, in train_resuming
    return original(self, resume_from_checkpoint, *args, **kwargs)
  File "/usr/lib/python3/dist-packages/transformers/trainer.py", line 2241, in train
    return inner_training_loop(
RuntimeError: shape mismatch in my loss
"""
OOM = "Traceback (most recent call last):\nRuntimeError: CUDA out of memory.\n"


def test_trainguards_own_frames_are_a_library_to_the_script(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, HF_EDITABLE)
    assert d.culprit.frame == "/home/u/proj/hf_train.py:41 in <module>"
    assert d.culprit.in_library


def test_a_utf16_log_is_read_as_text(tmp_path: Path) -> None:
    for encoding in ("utf-16", "utf-16-be"):
        p = tmp_path / f"{encoding}.log"
        bom = b"\xfe\xff" if encoding == "utf-16-be" else b""
        p.write_bytes(bom + OOM.encode(encoding))
        report = diagnose_paths([p])
        assert report.diagnosis is not None and report.diagnosis.category == Category.GPU_OOM
        assert report.diagnosis.evidence is not None
        assert report.diagnosis.evidence.text == "RuntimeError: CUDA out of memory."
        assert report.problems == []


def test_a_file_that_is_not_text_is_read_with_a_word_that_it_is_not(tmp_path: Path) -> None:
    binary = tmp_path / "core.log"
    binary.write_bytes(os.urandom(8192))
    latin1 = tmp_path / "latin1.log"
    latin1.write_bytes(("Schritt 5 f\xfcr das Modell\n" * 30 + OOM).encode("latin-1"))
    report = diagnose_paths([binary, latin1])
    assert len(report.problems) == 1 and "core.log: does not look like a text log" in \
        report.problems[0]
    assert report.diagnosis is not None and report.diagnosis.category == Category.GPU_OOM


def test_a_gzipped_log_cut_short_gives_what_came_before_and_the_fix(tmp_path: Path) -> None:
    """A .gz cut short: gzip.open's last read raised and took every line of it along ('cannot
    read it', no Fix); the lines before the break are read, and the problem names the fix."""
    import gzip

    whole = gzip.compress(OOM.encode() + os.urandom(20000).hex().encode() + b"\n")
    path = tmp_path / "rank-2.log.gz"
    path.write_bytes(whole[:len(whole) // 2])
    report = diagnose_paths([path])
    assert report.diagnosis is not None and report.diagnosis.category == Category.GPU_OOM
    (problem,) = report.problems
    assert "rank-2.log.gz: cut short or damaged" in problem and "gzip -t" in problem
    two = tmp_path / "two.log.gz"  # members one after another (`cat a.gz b.gz`) read whole
    two.write_bytes(gzip.compress(b"step 1\n" * 50) + gzip.compress(OOM.encode()))
    report = diagnose_paths([two])
    assert report.diagnosis is not None and report.diagnosis.evidence is not None
    assert report.diagnosis.evidence.line == 52 and report.problems == []


def test_a_rank_whose_end_was_never_reported_is_not_code_none() -> None:
    """(walk-through 23) A lost node's rank: 'rank 1 exited with code None'."""
    from trainguard.diagnosis.candidates import RankExit, plain_exit

    assert plain_exit(RankExit(1, True, None)).summary == (
        "rank 1 ended with no exit code reported (its node was lost, or its agent) and left "
        "no known error in its log")
    assert "exited with code 3 and" in plain_exit(RankExit(1, True, 3)).summary


def test_a_gloo_deciding_line_says_its_nccl_named_category_covers_gloo(tmp_path: Path) -> None:
    """Nit: a gloo job's timeout read `nccl_timeout_or_hang` and sent its reader looking for
    NCCL; the verdict line now says whose line decided it (an NCCL one says nothing more)."""
    gloo = tmp_path / "gloo.log"
    gloo.write_text(traceback_of(
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:136] Timed out "
        "waiting 1800000ms for send operation to complete"))
    out = tg("diagnose", str(gloo)).stdout
    assert out.startswith("nccl_timeout_or_hang (collective_timeout) [gloo's: the category "
                          "covers NCCL, gloo and HCCL]: "), out
    nccl = tmp_path / "nccl.log"
    nccl.write_text(traceback_of(
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, "
        "unhandled system error, NCCL version 2.14.3"))
    out = tg("diagnose", str(nccl)).stdout
    assert out.startswith("nccl_communication_error") and "[" not in out.split(":")[0], out
    # (reread) said by the diagnosis itself: the event a job records and --json too
    import json

    from trainguard.diagnosis.attempt import diagnosis_message
    from trainguard.diagnosis.taxonomy import (
        Category,
        Diagnosis,
        Evidence,
        FaultDomain,
        RestartHelps,
    )

    assert json.loads(tg("diagnose", str(gloo), "--json").stdout)["diagnosis"]["library"] == \
        "gloo"
    d = Diagnosis(Category.NCCL_TIMEOUT_OR_HANG, FaultDomain.FRAMEWORK, RestartHelps.YES,
                  "timed out", "raise the timeout",
                  evidence=Evidence("rank-0.log", 9, "[gloo/transport/tcp/pair.cc] Timed out"))
    assert diagnosis_message(d).startswith("nccl_timeout_or_hang [gloo's: the category covers "
                                           "NCCL, gloo and HCCL] (framework, restart helps")


def test_a_full_disk_s_advice_names_the_path_its_line_names(tmp_path: Path) -> None:
    """Nit: the advice said to free space 'where the job writes' though the line named the
    file; it now names it and the command that shows its file system."""
    d = diagnose_text(tmp_path, traceback_of(
        "OSError: [Errno 28] No space left on device: '/ckpt/run3/step_100.pt'"))
    assert d.category == Category.DISK_FULL_OR_STORAGE_IO
    assert "The line names /ckpt/run3/step_100.pt: `df -h /ckpt/run3` shows its file system." \
        in d.advice, d.advice
    bare = diagnose_text(tmp_path, traceback_of("OSError: [Errno 28] No space left on device"))
    assert "The line names" not in bare.advice
