"""Fixtures shared by the unit tests of the wire."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainguard.controller.hub import Hub
from trainguard.wire import new_token


@pytest.fixture
def hub() -> Iterator[tuple[Hub, str]]:
    """A live hub on loopback and its job token."""
    token = new_token()
    h = Hub(token, "127.0.0.1")
    try:
        yield h, token
    finally:
        h.close()
