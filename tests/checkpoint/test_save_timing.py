"""What a committed save says about the training loop's wait (goodput places it from these):
an asynchronous save's loop went on before the write ended (`resumed_before_s` > 0, its wait
the copy only); a synchronous save's loop waited for the write too (`blocked_s` includes
it, `resumed_before_s` 0); a save on the way out blocks no loop. Real storage (a local dir),
the real library, its messages read where the agent would."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoint.conftest import AgentChannel, step_state
from trainguard.checkpoint import Checkpointer

pytestmark = pytest.mark.usefixtures("keep_rng")


def test_an_async_saves_loop_goes_on_before_the_write_ends(tmp_path: Path,
                                                           agent_channel: AgentChannel) -> None:
    ckpt = Checkpointer(tmp_path / "ck", async_save=True)
    ckpt.save(1, step_state(1, mib=64))
    ckpt.close()
    saved = agent_channel.wait_for("checkpoint_saved", step=1)
    assert saved["resumed_before_s"] >= saved["write_s"] * 0.9 > 0, saved
    assert saved["blocked_s"] == pytest.approx(ckpt.last_blocked_s, abs=0.01)


def test_a_sync_saves_wait_includes_its_write(tmp_path: Path,
                                              agent_channel: AgentChannel) -> None:
    ckpt = Checkpointer(tmp_path / "ck", async_save=False)
    ckpt.save(1, step_state(1, mib=64))
    ckpt.close()
    saved = agent_channel.wait_for("checkpoint_saved", step=1)
    assert saved["resumed_before_s"] < 0.05, saved
    assert saved["blocked_s"] >= saved["write_s"] > 0, saved
