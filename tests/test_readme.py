"""The README's examples, run as a user pastes them: every Python block is a complete script,
run in order in one process on memory, a local directory and S3 (moto), with only the storage
URL and the directories changed; the MCP configuration block is valid JSON whose command
starts a server an MCP client can list the tools of."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from _mountproc import cli_env
from agentvfs.mounts import fuse_available
from agentvfs.testing import MotoServer

README = Path(__file__).resolve().parents[1] / "README.md"
URL = "s3://my-bucket/docs"

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README.read_text(encoding="utf-8"), re.M | re.S)


def _agents_sdk(code: str) -> bool:
    """A block for the OpenAI Agents SDK, which runs in an environment of its own."""
    return "from agents" in code


def api_blocks() -> list[str]:
    return [code for code in blocks("python") if not _agents_sdk(code)]


# Runs each block as its own __main__, in order, in this one process (so that memory storage
# written by one block is there for the next, as a local directory or a bucket would be).
RUNNER = """
import json, sys, traceback
for index, code in enumerate(json.load(open(sys.argv[1]))):
    print(f"--- block {index}", flush=True)
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__main__"})
print("--- all ran", flush=True)
"""


def test_the_readme_has_the_examples_it_promises() -> None:
    python = api_blocks()
    assert len(python) >= 6
    assert all(URL in code for code in python)
    assert all("import " in code.split("\n", 1)[0] or code.startswith("from ") for code in python)


@pytest.mark.parametrize("kind", ["memory", "local", pytest.param("s3", marks=pytest.mark.s3)])
def test_every_python_example_runs(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env = cli_env()
    if kind == "memory":
        url = "memory://readme-docs"
    elif kind == "local":
        url = f"file://{tmp_path}/store/docs"
        (tmp_path / "store/docs").mkdir(parents=True)
    else:
        moto: MotoServer = request.getfixturevalue("moto")
        with contextlib.suppress(Exception):  # made by an earlier run in this session
            moto.create_bucket("my-bucket")
        url = f"s3://my-bucket/readme-{tmp_path.name}"
        # The examples name no endpoint: botocore takes it from the environment.
        env.update(AWS_ENDPOINT_URL=moto.endpoint_url, S3_ENDPOINT=moto.endpoint_url, S3_KEY="testing", S3_SECRET="testing")
    (tmp_path / "mnt").mkdir()
    (tmp_path / "agent").mkdir()
    codes = []
    for code in api_blocks():
        if "storage_options" in code and kind != "s3":
            continue  # the credentials example is about S3
        codes.append(
            code.replace(URL, url).replace("/mnt/docs", f"{tmp_path}/mnt").replace("/tmp/agent", f"{tmp_path}/agent")
        )
    (tmp_path / "blocks.json").write_text(json.dumps(codes))
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, os.fspath(tmp_path / "blocks.json")],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "--- all ran" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "# Today\nTODO: write the report" in out
    assert "1 match across 1 file" in out  # the grep tool
    assert "notes/today.md [2]" in out  # the blocking read-only grep
    assert "mnt/notes/today.md:TODO: write the report" in out  # grep through the mount
    assert "docs/new.txt" in out  # the sandbox command
    assert re.search(r"^guide\.md \d", out, re.M) and " 0.0\n" not in out  # search
    assert "('plan.md',) ('scratch.txt',)" in out and "+2. rewrite everything" in out  # a snapshot's diff
    assert "['plan.md: modified', 'scratch.txt: added']" in out  # a restore keeps what changed since
    assert "('plan.md', 'scratch.txt') 1. read\n2. write" in out  # a forced one puts it back
    if kind == "s3":
        assert "storage answers" in out


def test_the_mcp_configuration_starts_a_server(tmp_path: Path) -> None:
    (config,) = [json.loads(block) for block in blocks("json") if "mcpServers" in block]
    server = config["mcpServers"]["agentvfs"]
    command = shutil.which(server["command"], path=os.path.dirname(sys.executable)) or shutil.which(server["command"])
    assert command is not None, f"{server['command']} is not on PATH"
    args = [a.replace("/path/to/project", os.fspath(tmp_path)) for a in server["args"]]
    (tmp_path / "hello.txt").write_text("hi\n")

    async def listed() -> list[str]:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(command=command, args=args, env={"PATH": os.environ.get("PATH", "")})
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            result = await client.call_tool("mastra_workspace_read_file", {"path": "/hello.txt"})
            assert not result.isError, result.content
            return [tool.name for tool in (await client.list_tools()).tools]

    with open(tmp_path / "stderr.log", "w") as errlog:
        names = anyio.run(listed)
    assert "mastra_workspace_read_file" in names and "mastra_workspace_edit_file" in names
    done = subprocess.run([command, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("agentvfs ")


AGENTS_PYTHON = Path(__file__).resolve().parents[1] / ".venv/opt/mcp2/bin/python"


@pytest.mark.skipif(not AGENTS_PYTHON.exists(), reason="no .venv/opt/mcp2 (scripts/setup.sh test makes it)")
def test_the_openai_agents_sdk_example_runs(tmp_path: Path) -> None:
    (code,) = [code for code in blocks("python") if _agents_sdk(code)]
    (tmp_path / "notes.txt").write_text("x\n")
    env = {"PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}  # agentvfs on PATH
    done = subprocess.run(
        [os.fspath(AGENTS_PYTHON), "-c", code.replace("/path/to/project", os.fspath(tmp_path))],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("editor ['mastra_workspace_read_file', 'mastra_workspace_write_file'")
