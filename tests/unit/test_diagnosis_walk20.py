"""Walk-through 20's diagnosis findings 3 to 5: a message that spans lines is shown whole;
a missing training data file named `.bin`
(nanoGPT's `train.bin`) is a path to fix, not a checkpoint that failed to load; an exception
a DataLoader worker raised is blamed on the dataset code that raised it (its `Original
Traceback`), not on the `for` loop that received it."""

from __future__ import annotations

from pathlib import Path

from tests.unit.helpers import diagnose_text, tg
from trainguard.diagnosis.rules import load_rules
from trainguard.diagnosis.scan import scan_bytes
from trainguard.diagnosis.sources import default_trigger
from trainguard.diagnosis.taxonomy import Category, RestartHelps

NANOGPT = """Traceback (most recent call last):
  File "/work/nanoGPT/train.py", line 264, in <module>
    X, Y = get_batch('train') # fetch the very first batch
  File "/work/nanoGPT/train.py", line 116, in get_batch
    data = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
  File "/usr/lib/python3/dist-packages/numpy/core/memmap.py", line 228, in __new__
    f_ctx = open(os_fspath(filename), ('r' if mode == 'c' else mode)+'b')
FileNotFoundError: [Errno 2] No such file or directory: 'data/shakespeare_char/{name}'
"""


def test_a_missing_training_data_file_is_a_path_to_fix_not_a_checkpoint(
        tmp_path: Path) -> None:
    for name in ("train.bin", "val.bin", "my-gpt2_text_document.bin",
                 "fineweb_train_000001.bin", "fineweb_val_000000.bin", "train_0.bin"):
        d = diagnose_text(tmp_path, NANOGPT.format(name=name))
        assert d.category == Category.CONFIG_ERROR, (name, d)
        assert d.restart_helps == RestartHelps.NO
        assert d.evidence is not None and name in d.evidence.text
    d = diagnose_text(tmp_path, NANOGPT.format(name="pytorch_model.bin"))
    assert d.category == Category.CHECKPOINT_LOAD_ERROR  # a model's weights still are


# torch 2.x, as a real run of a dataset whose __getitem__ raised printed it
DATALOADER = """Traceback (most recent call last):
  File "/tmp/r4/dl.py", line 14, in <module>
    for step, batch in enumerate(loader):
  File "/v/site-packages/torch/utils/data/dataloader.py", line 733, in __next__
    data = self._next_data()
  File "/v/site-packages/torch/utils/data/dataloader.py", line 1567, in _process_data
    data.reraise()
  File "/v/site-packages/torch/_utils.py", line 794, in reraise
    raise exception
KeyError: Caught KeyError in DataLoader worker process 1.
Original Traceback (most recent call last):
  File "/v/site-packages/torch/utils/data/_utils/worker.py", line 374, in _worker_loop
    data = fetcher.fetch(index)  # type: ignore[possibly-undefined]
  File "/v/site-packages/torch/utils/data/_utils/fetch.py", line 54, in fetch
    data = [self.dataset[idx] for idx in possibly_batched_index]
  File "/tmp/r4/dl.py", line 10, in __getitem__
    return self.items[i]
KeyError: 6
"""


def test_a_dataloader_workers_exception_is_blamed_on_the_dataset_code_that_raised_it(
        tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, DATALOADER)
    assert d.category == Category.USER_CODE_ERROR
    assert d.culprit.frame == "/tmp/r4/dl.py:10 in __getitem__", d.culprit
    assert d.evidence is not None and "DataLoader worker process 1" in d.evidence.text
    assert [s.text for s in d.symptoms] == ["KeyError: 6"]  # the worker's side, not a cause


STATE_DICT = """step 0: train loss 10.9
Traceback (most recent call last):
  File "/work/nanoGPT/train.py", line 161, in <module>
    model.load_state_dict(state_dict)
  File "/v/site-packages/torch/nn/modules/module.py", line 2215, in load_state_dict
    raise RuntimeError('Error(s) in loading state_dict for {}:\\n\\t{}'.format(
RuntimeError: Error(s) in loading state_dict for GPT:
\tMissing key(s) in state_dict: "transformer.wte.weight".
\tUnexpected key(s) in state_dict: "_orig_mod.transformer.wte.weight".
wandb: Waiting for W&B process to finish
"""


def test_a_message_that_spans_lines_is_shown_whole_with_its_deciding_line(
        tmp_path: Path) -> None:
    """Walk-through 20, finding 4: the evidence stopped at `... for GPT:`, the keys that say
    what is wrong were left out."""
    d = diagnose_text(tmp_path, STATE_DICT)
    assert d.category == Category.CHECKPOINT_LOAD_ERROR
    assert d.evidence is not None
    assert d.evidence.text == "RuntimeError: Error(s) in loading state_dict for GPT:"
    assert d.evidence.more == ('Missing key(s) in state_dict: "transformer.wte.weight".',
                               'Unexpected key(s) in state_dict: '
                               '"_orig_mod.transformer.wte.weight".')
    assert d.evidence.to_dict()["more"] == list(d.evidence.more)
    r = tg("diagnose", str(tmp_path / "console.log"))
    assert '      Missing key(s) in state_dict: "transformer.wte.weight".' in r.stdout


def test_the_rest_of_a_message_does_not_depend_on_where_the_bytes_were_cut() -> None:
    data = STATE_DICT.encode()
    whole = scan_bytes(load_rules(), default_trigger(), "c.log", [data])
    assert any(f.more for f in whole)
    for cut in range(1, len(data)):
        assert scan_bytes(load_rules(), default_trigger(), "c.log",
                          [data[:cut], data[cut:]]) == whole, cut


def test_a_hangs_stack_dumps_are_not_read_as_logs(tmp_path: Path) -> None:
    """`trainguard diagnose DIR` of an attempt's logs read its `stacks/` (the py-spy dumps of
    a hang and of the looks before one) as rank logs (review of the stack looks)."""
    from trainguard.diagnosis.sources import log_files

    attempt = tmp_path / "logs" / "attempt-0"
    (attempt / "stacks" / "looks").mkdir(parents=True)
    (attempt / "rank-0.log").write_text("x\n")
    (attempt / "stacks" / "rank-0.txt").write_text("Thread 1 (idle)\n")
    (attempt / "stacks" / "looks" / "rank-0.txt").write_text("Thread 1\n")
    (tmp_path / "mine" / "stacks").mkdir(parents=True)  # a user's own dir of that name
    (tmp_path / "mine" / "stacks" / "a.log").write_text("x\n")
    assert log_files(tmp_path) == [attempt / "rank-0.log", tmp_path / "mine" / "stacks" / "a.log"]


OOM = ('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.64 TiB. GPU {r} has a '
       'total capacity of 79.15 GiB of which 1.2 GiB is free.')


def test_the_root_causes_copies_on_other_ranks_are_counted_not_listed_as_symptoms(
        tmp_path: Path) -> None:
    """Walk-through 20, nit 6: every rank hit the same OOM; ranks 1 and 2's copies were
    listed as a symptom the OOM explains. Now the evidence says 3 ranks printed it, and what
    else the ranks printed stays a symptom."""
    from trainguard.diagnosis.sources import diagnose_paths

    logs = tmp_path / "logs"
    logs.mkdir()
    for r in range(3):
        tail = ("\n[rank3]: RuntimeError: NCCL communicator was aborted on rank 3.\n"
                if r == 2 else "\n")
        (logs / f"rank-{r}.log").write_text(
            "step 1 loss 0.5\nTraceback (most recent call last):\n"
            '  File "train.py", line 10, in <module>\n'
            '    x = torch.zeros(10**12, device="cuda")\n' + OOM.format(r=r) + tail)
    d = diagnose_paths(sorted(logs.iterdir())).diagnosis
    assert d is not None and d.category == Category.GPU_OOM
    assert d.evidence is not None and d.evidence.rank == 0 and d.evidence.count == 3
    assert all("out of memory" not in s.text for s in d.symptoms), d.symptoms
    assert any("communicator was aborted" in s.text for s in d.symptoms), d.symptoms
    out = tg("diagnose", str(logs)).stdout
    assert "evidence: " in out and "[3 ranks printed it]" in out, out
