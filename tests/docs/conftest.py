"""The acceptance tests' fresh user directory, for the docs' commands too, and a server
of the user's own for them to register."""

from collections.abc import Iterator

import pytest

from app.postgres.sandbox import Sandbox
from tests.acceptance.conftest import user_dir

__all__ = ["staging", "user_dir"]


@pytest.fixture
def staging() -> Iterator[Sandbox]:
    with Sandbox.create() as sb:
        yield sb
