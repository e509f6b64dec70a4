"""PyTorch Lightning: a resumed fit's train loaders. The fit loop sets the samplers' epoch
before it loads the loaders' saved state (torchdata's StatefulDataLoader fixes a
DistributedSampler's order when its state is loaded, and Lightning sets the epoch only
after), and a resume inside an epoch with a loader that keeps no position is said not exact.
Used by integrations.lightning's `prepare`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainguard.integrations.common import log, resumed

if TYPE_CHECKING:
    from pytorch_lightning.trainer.trainer import Trainer


def _set_epoch(loader: Any, epoch: int) -> None:
    """`set_epoch` on the loader's sampler and its batch sampler's (as Lightning does)."""
    samplers = {id(s): s for s in (getattr(loader, "sampler", None),
                                   getattr(getattr(loader, "batch_sampler", None), "sampler", None))
                if s is not None}
    for s in samplers.values():
        if callable(getattr(s, "set_epoch", None)):
            s.set_epoch(epoch)


def _torchdata_batch_sampler(loader: Any) -> Any:
    """The loader's torchdata BatchSampler (a StatefulDataLoader's with `batch_size`), or None;
    torchdata is not imported here: a loader of its kind has imported it."""
    module = sys.modules.get("torchdata.stateful_dataloader.sampler")
    batch_sampler = getattr(loader, "batch_sampler", None)
    return batch_sampler if module is not None and isinstance(
        batch_sampler, module.BatchSampler) else None


def sampler_epoch_first(trainer: Trainer) -> None:
    """Make the fit loop set the samplers' epoch before it loads the train loaders' saved
    state. Lightning loads the state, creates the iterator (a StatefulDataLoader's
    BatchSampler calls `iter(sampler)` then: a DistributedSampler draws its order there) and
    sets the epoch only after, so a resume in any epoch but the first went on in the first
    epoch's order. A StatefulDataLoader's state saved at an epoch's last batch is not loaded:
    it would skip the whole next epoch; that epoch starts afresh in its own order.
    Idempotent."""
    loop = trainer.fit_loop
    original: Callable[[], None] | None = getattr(loop, "_load_combined_loader_states", None)
    if original is None or getattr(original, "__trainguard__", False):
        return  # a Lightning without loader states (before PR #19475), or done

    def load_states() -> None:
        states, combined = loop._combined_loader_states_to_load, loop._combined_loader
        if loop.restarting and combined is not None:
            _say_if_not_exact(loop, combined.flattened)
        if loop.restarting and states and combined is not None:
            epoch = int(loop.epoch_progress.current.completed)  # the saved state's epoch
            stateful = [dl for dl in combined.flattened if _keeps_state(dl)]
            # saved at the epoch's last batch: Lightning goes on with the next epoch
            last = bool(loop.epoch_loop.batch_progress.is_last_batch)
            fresh = []
            for i, (dl, state) in enumerate(zip(stateful, states, strict=False)):
                finished = last or (isinstance(state, dict)
                                    and state.get("_iterator_finished") is True)
                if finished and _torchdata_batch_sampler(dl) is not None:
                    states[i] = {}  # StatefulDataLoader: nothing to load
                    fresh.append(dl)
                else:
                    _set_epoch(dl, epoch)
            original()
            for dl in fresh:  # draw the next epoch's order now, not the one from __init__
                _set_epoch(dl, epoch + 1)
                _torchdata_batch_sampler(dl).load_state_dict({"samples_yielded": 0})
        else:
            original()

    load_states.__trainguard__ = True  # type: ignore[attr-defined]
    loop._load_combined_loader_states = load_states  # type: ignore[method-assign]


def _keeps_state(loader: Any) -> bool:
    """A loader Lightning saves and gives back a position of (PR #19475's interface)."""
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None))


def _say_if_not_exact(loop: Any, loaders: list[Any]) -> None:
    """A resume inside an epoch with a loader that keeps no state (a plain DataLoader)
    draws that epoch from its start again: said once, with the fix (Lightning's own warning
    does not say what to use instead)."""
    done = int(loop.epoch_loop.batch_progress.current.processed)  # (completed: one behind)
    if done == 0 or bool(loop.epoch_loop.batch_progress.is_last_batch):
        return
    plain = [dl for dl in loaders if not _keeps_state(dl)]
    if plain:
        why = (f"resumed after batch {done} of epoch "
               f"{int(loop.epoch_progress.current.completed)} with a {type(plain[0]).__name__} "
               "that keeps no position: the rest of this epoch is drawn from its start again")
        fix = "a torchdata StatefulDataLoader resumes where it stopped (docs/integrations.md)"
        log(f"lightning: {why}, not exact; {fix}")
        resumed(None, int(loop.trainer.global_step), not_exact=f"{why}; {fix}")  # an event
