"""pytest plugin registered by agentvfs: fixtures for the conformance suite."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run the suite's async tests on asyncio unless a test module asks for more."""
    return "asyncio"
