"""Fixtures shared by unit tests: a live hub for the wire's, a /dev/shm of our own and a
process guardian for the memory regions'."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.controller.hub import Hub
from trainguard.node import procs
from trainguard.wire import new_token
from trainguard.worker.contract import ENV_SHM_ROOT


@pytest.fixture
def hub() -> Iterator[tuple[Hub, str]]:
    """A live hub on loopback and its job token."""
    token = new_token()
    h = Hub(token, "127.0.0.1")
    try:
        yield h, token
    finally:
        h.close()


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /dev/shm of our own: every user may write it, sticky."""
    root = tmp_path / "shm"
    root.mkdir()
    os.chmod(root, 0o1777)
    monkeypatch.setenv(ENV_SHM_ROOT, str(root))
    return root


@pytest.fixture
def guardian() -> Iterator[procs.Guardian]:
    g = procs.Guardian("")
    yield g
    g.close()
