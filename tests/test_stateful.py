"""Random operation sequences against the model of the contract (agentvfs.testing._stateful)."""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import partial

import anyio
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from agentvfs.testing import Harness, MotoServer, local_harness
from agentvfs.testing._stateful import make_state_machine
from conftest import memory_harness, s3_harness

# No example database: runs leave no files behind, and each run explores afresh.
FAST = settings(max_examples=60, stateful_step_count=25, deadline=None, database=None)
S3 = settings(
    max_examples=12,
    stateful_step_count=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def fresh_local_harness() -> Harness:
    """A LocalFilesystem over a new temporary directory, removed at the end of the example."""
    tmp = tempfile.mkdtemp(prefix="agentvfs-stateful-")
    harness = local_harness(os.path.join(tmp, "base"))
    harness.extra["cleanup"] = partial(shutil.rmtree, tmp, ignore_errors=True)
    return harness


def test_memory() -> None:
    machine = make_state_machine(memory_harness, name="MemoryMachine")
    run_state_machine_as_test(machine, settings=FAST)


def test_local() -> None:
    machine = make_state_machine(fresh_local_harness, name="LocalMachine")
    run_state_machine_as_test(machine, settings=FAST)


@pytest.mark.s3
def test_s3(moto: MotoServer) -> None:
    machine = make_state_machine(partial(s3_harness, moto), deep_check_every=3, name="S3Machine")
    run_state_machine_as_test(machine, settings=S3)


@pytest.mark.s3
@pytest.mark.parametrize("implied_by", ["write_file", "mkdir"])
def test_s3_write_onto_implied_directory(moto: MotoServer, implied_by: str) -> None:
    """Found by the machine: cached listings must learn the directories writes imply."""
    fs = s3_harness(moto).fs

    async def scenario() -> bool:
        await fs.write_file("b", b"")  # the root's names are listed and cached: {"b"}
        if implied_by == "mkdir":
            await fs.mkdir("a/x")
        else:
            await fs.write_file("a/x", b"")  # implies directory "a"
        try:
            await fs.write_file("a", b"")
        except IsADirectoryError:
            return True
        return False

    assert anyio.run(scenario), "write_file('a') succeeded although 'a' is a directory"
