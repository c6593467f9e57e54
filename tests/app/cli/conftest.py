from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _sigterm_back() -> Iterator[None]:
    """main() makes SIGTERM unwind like Ctrl-C (for its with-blocks): not past the test."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)
