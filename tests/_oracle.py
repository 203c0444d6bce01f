"""A differential oracle: agentvfs's workspace tools against the reference implementation.

The reference (``@mastra/core``, pinned in ``tests/oracle/package-lock.json`` and installed by
``scripts/setup.sh`` under ``.venv/opt/mastra``) runs in Node through ``tests/oracle/driver.cjs``;
agentvfs runs here, in process. Both get the same cases: a fixture tree with fixed times, a
workspace configuration and a sequence of tool calls. What the model would receive from each
call is compared byte for byte after a few masks (each side's directory, background PIDs, the
times of files written during the run), and so is the tree each case leaves on disk.

A difference is either a known, deliberate deviation (:data:`DEVIATIONS`, each with its reason,
also listed in ``docs/differences-from-mastra.md``) or a failure.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import anyio

from agentvfs import LocalFilesystem, LocalSandbox, Workspace

ROOT = Path(__file__).resolve().parent.parent
ORACLE_DIR = ROOT / "tests" / "oracle"
#: Fixture files are dated from here, one second apart; timestamps outside the fixture are masked.
T0 = 1_700_000_000
CALL_TIMEOUT_S = 30.0


def reference_modules() -> Path:
    """Where the reference's ``node_modules`` live (``AGENTVFS_MASTRA_MODULES`` overrides)."""
    return Path(os.environ.get("AGENTVFS_MASTRA_MODULES", ROOT / ".venv" / "opt" / "mastra"))


def node_binary() -> str | None:
    """The Node the reference declares (22, installed by setup), else the machine's ``node``."""
    for candidate in sorted(
        (ROOT / ".venv" / "opt" / "node22" / "node_modules").glob("node-linux-*/bin/node")
    ):
        return str(candidate)
    return shutil.which("node")


def reference_missing() -> str | None:
    """Why the reference cannot run here, or None when it can."""
    if node_binary() is None:
        return "node is not installed (scripts/setup.sh test installs it)"
    if not (reference_modules() / "node_modules" / "@mastra" / "core" / "package.json").is_file():
        return (
            f"the reference is not installed in {reference_modules()} (run scripts/setup.sh test)"
        )
    return None


# -- cases --------------------------------------------------------------------------------------


@dataclass
class Case:
    """One fixture, one workspace, a sequence of tool calls (``tool`` without its prefix)."""

    id: str
    files: list[dict[str, Any]]
    calls: list[dict[str, Any]]
    workspace: dict[str, Any] = field(default_factory=dict)
    #: Also compare the tool set (keys, ids, approval, descriptions), the instructions and get_info.
    inspect: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "files": self.files,
            "calls": self.calls,
            "workspace": self.workspace,
            "inspect": self.inspect,
        }


def file(path: str, data: str | bytes = "", *, mode: int = 0o644, age: int = 0) -> dict[str, Any]:
    """A fixture file (text is UTF-8), dated ``T0 + age``."""
    raw = data.encode() if isinstance(data, str) else data
    return {
        "path": path,
        "data_b64": base64.b64encode(raw).decode(),
        "mode": mode,
        "mtime": T0 + age,
    }


def directory(path: str, *, age: int = 0) -> dict[str, Any]:
    """A fixture directory (possibly empty), dated ``T0 + age``."""
    return {"path": path, "dir": True, "mtime": T0 + age}


def symlink(path: str, target: str) -> dict[str, Any]:
    """A fixture symlink; ``../outside/...`` reaches the case's own directory beside the workspace."""
    return {"path": path, "symlink": target}


def call(tool: str, wait_ms: int = 0, **input: Any) -> dict[str, Any]:
    """A tool call; ``"$PID"`` in a string stands for the last background process started."""
    out: dict[str, Any] = {"tool": tool, "input": input}
    if wait_ms:
        out["wait_ms"] = wait_ms
    return out


# -- a vector store and an embedder, as the driver's ------------------------------------------


def embed(text: str) -> list[float]:
    """Letter counts, weighted by letter: the driver's ``embed``, operation for operation."""
    v = [0.0] * 27
    for ch in text.lower():
        c = ord(_first_unit(ch)) - 97
        if 0 <= c < 26:
            v[c] += 1 + c / 100
        else:
            v[26] += 0.01
    v[26] += 0.001
    return v


def _first_unit(ch: str) -> str:
    # JavaScript's charCodeAt(0) of a character beyond U+FFFF is its high surrogate.
    code = ord(ch)
    return chr(0xD800 + ((code - 0x10000) >> 10)) if code > 0xFFFF else ch


class PlainVectorStore:
    """Cosine similarity over every stored vector: the driver's ``PlainVectorStore``."""

    def __init__(self) -> None:
        self.indexes: dict[str, dict[str, tuple[list[float], dict[str, Any]]]] = {}

    async def create_index(self, index_name: str, dimension: int, metric: str = "cosine") -> None:
        self.indexes.setdefault(index_name, {})

    async def upsert(
        self,
        index_name: str,
        vectors: list[list[float]],
        metadata: list[dict[str, Any]],
        ids: list[str],
    ) -> list[str]:
        index = self.indexes[index_name]
        for id, vector, meta in zip(ids, vectors, metadata, strict=True):
            index[id] = (vector, meta)
        return ids

    async def query(
        self, index_name: str, query_vector: list[float], top_k: int, filter: Any = None
    ) -> list[dict[str, Any]]:
        def norm(a: list[float]) -> float:
            total = 0.0
            for x in a:
                total += x * x
            return math.sqrt(total)

        def dot(a: list[float], b: list[float]) -> float:
            total = 0.0
            for x, y in zip(a, b, strict=False):
                total += x * y
            return total

        index = self.indexes.get(index_name, {})
        scored = [
            (dot(v, query_vector) / (norm(v) * norm(query_vector)), id, meta)
            for id, (v, meta) in index.items()
        ]
        scored.sort(key=lambda hit: -hit[0])  # stable, as JavaScript's sort
        return [{"id": id, "score": score, "metadata": meta} for score, id, meta in scored[:top_k]]

    async def delete_vector(self, index_name: str, id: str) -> None:
        self.indexes.get(index_name, {}).pop(id, None)

    async def delete_vectors(self, index_name: str, filter: dict[str, Any]) -> int:
        index = self.indexes.get(index_name, {})
        gone = [
            id
            for id, (_, meta) in index.items()
            if all(meta.get(k) == v for k, v in filter.items())
        ]
        for id in gone:
            del index[id]
        return len(gone)


# -- the fixture, on this side ------------------------------------------------------------------


def build_fixture(root: Path, entries: Sequence[dict[str, Any]]) -> None:
    """Lay out ``entries`` under ``root`` as the driver does."""
    root.mkdir(parents=True, exist_ok=True)
    dirs = []
    for e in entries:
        p = root / e["path"]
        p.parent.mkdir(parents=True, exist_ok=True)
        if e.get("dir"):
            p.mkdir(parents=True, exist_ok=True)
            dirs.append(e)
        elif "symlink" in e:
            os.symlink(e["symlink"], p)
        else:
            p.write_bytes(base64.b64decode(e["data_b64"]))
            os.chmod(p, e["mode"])
            os.utime(p, (e["mtime"], e["mtime"]))
    for e in sorted(dirs, key=lambda e: -e["path"].count("/")):
        os.utime(root / e["path"], (e["mtime"], e["mtime"]))


def snapshot(base: Path) -> list[list[str]]:
    """Names, kinds and content digests under ``base`` (the case directory), as the driver gives."""
    out: list[list[str]] = []

    def walk(rel: str) -> None:
        for name in sorted(
            os.listdir(base / rel) if rel else os.listdir(base), key=lambda n: n.encode("utf-16-be")
        ):
            r = f"{rel}/{name}" if rel else name
            p = base / r
            if p.is_symlink():
                out.append([r, "link", os.readlink(p)])
            elif p.is_dir():
                out.append([r, "dir", ""])
                walk(r)
            else:
                out.append([r, "file", hashlib.sha256(p.read_bytes()).hexdigest()])

    if base.exists():
        walk("")
    else:
        out.append(["", "gone", ""])
    return out


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _camel(name: str) -> str:
    if name == "memory_mb":
        return "memoryMB"  # the reference's one key with an acronym
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


def snake_keys(value: Any) -> Any:
    """A reference tools config as a Python caller writes it (option names in snake case)."""
    if isinstance(value, dict):
        return {_snake(k): snake_keys(v) for k, v in value.items()}
    return value


def camel_keys(value: Any) -> Any:
    """``get_info()`` as the reference spells it: keys in camel case, and a key whose value is
    None left out as JavaScript leaves out ``undefined``."""
    if isinstance(value, dict):
        return {_camel(k): camel_keys(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [camel_keys(v) for v in value]
    return value


def _hook_output(value: Any) -> Any:
    return (
        value
        if value is None or isinstance(value, (str, int, float, bool, list, dict))
        else str(value)
    )


async def _run_case_here(case: Case, base: Path) -> dict[str, Any]:
    root = base / case.id / "ws"
    build_fixture(root, case.files)
    spec = case.workspace
    kwargs: dict[str, Any] = {
        "id": "oracle-ws",
        "name": "Oracle workspace",
        "filesystem": LocalFilesystem(base_path=str(root), read_only=bool(spec.get("read_only"))),
    }
    if spec.get("sandbox"):
        kwargs["sandbox"] = LocalSandbox(working_directory=str(root))
    if spec.get("bm25"):
        kwargs["bm25"] = True
    if spec.get("vector"):
        kwargs["vector_store"] = PlainVectorStore()
        kwargs["embedder"] = embed
    if spec.get("auto_index_paths"):
        kwargs["auto_index_paths"] = spec["auto_index_paths"]
    if spec.get("skills"):
        kwargs["skills"] = spec["skills"]
    hook_log: list[list[Any]] = []
    if spec.get("tools") or spec.get("hooks"):
        kwargs["tools"] = snake_keys(spec.get("tools") or {})
    if spec.get("hooks") == "log":

        def before(ctx: dict[str, Any]) -> Any:
            hook_log.append(["before", ctx["tool_name"], ctx["workspace_tool_name"], ctx["input"]])
            if isinstance(ctx["input"], dict) and ctx["input"].get("path") == "blocked.txt":
                return {"proceed": False, "output": "BLOCKED BY HOOK"}
            return None

        def after(ctx: dict[str, Any]) -> None:
            error = str(ctx["error"]) if ctx.get("error") is not None else None
            hook_log.append(
                [
                    "after",
                    ctx["tool_name"],
                    ctx["workspace_tool_name"],
                    _hook_output(ctx["output"]),
                    error,
                ]
            )

        kwargs["tools"]["hooks"] = {"before_tool_call": before, "after_tool_call": after}
    calls: list[dict[str, Any]] = []
    inspected: dict[str, Any] = {}
    ws: Workspace | None = None
    try:
        ws = Workspace(**kwargs)
        await ws.init()
        tools = await ws.create_tools()
        if case.inspect:
            inspected["toolset"] = [
                [k, t.id, t.require_approval, t.description] for k, t in tools.items()
            ]
            inspected["schemas"] = [[k, t.input_schema] for k, t in tools.items()]
            inspected["instructions"] = ws.get_instructions()
            info = await ws.get_info(include_file_count=True)
            inspected["info"] = camel_keys(
                {k: v for k, v in info.items() if k not in ("created_at", "last_accessed_at")}
            )
        pid = "0"
        for c in case.calls:
            tool = tools.get(c["tool"]) or tools.get("mastra_workspace_" + c["tool"])
            if tool is None:
                calls.append({"kind": "absent"})
                continue
            args = json.loads(json.dumps(c["input"]).replace("$PID", pid))
            try:
                with anyio.fail_after(CALL_TIMEOUT_S):
                    result = await tool.execute(args)
                parts = tool.to_model_output(result)
                text = parts[0]["text"] if parts and parts[0]["type"] == "text" else ""
                found = re.search(r"\(PID: (\d+)\)", text)
                if found:
                    pid = found.group(1)
                calls.append({"kind": "ok", "parts": parts})
            except Exception as exc:
                if type(exc) is ValueError:
                    calls.append({"kind": "ok", "parts": [{"type": "invalid", "text": str(exc)}]})
                else:
                    calls.append({"kind": "error", "message": str(exc)})
            if c.get("wait_ms"):
                await anyio.sleep(c["wait_ms"] / 1000)
    except Exception as exc:
        calls.append({"kind": "setup-error", "message": str(exc)})
    finally:
        tree = snapshot(base / case.id)
        if ws is not None:
            # The outputs are recorded; a failing teardown changes none of them.
            with contextlib.suppress(Exception):
                await ws.destroy()
    return {
        "id": case.id,
        "root": str(root),
        "calls": calls,
        "tree": tree,
        "hooks": hook_log,
        "inspected": inspected,
    }


def run_here(cases: Sequence[Case], base: Path) -> dict[str, dict[str, Any]]:
    """Run ``cases`` through agentvfs under ``base``."""

    async def main() -> dict[str, dict[str, Any]]:
        return {c.id: await _run_case_here(c, base) for c in cases}

    return anyio.run(main)


def run_reference(cases: Sequence[Case], base: Path) -> dict[str, dict[str, Any]]:
    """Run ``cases`` through the reference (one Node process for the batch) under ``base``."""
    node = node_binary()
    assert node is not None, reference_missing()
    base.mkdir(parents=True, exist_ok=True)
    cases_file, out_file = base / "cases.json", base / "out.jsonl"
    cases_file.write_text(json.dumps({"cases": [c.to_json() for c in cases]}))
    proc = subprocess.run(
        [
            node,
            str(ORACLE_DIR / "driver.cjs"),
            str(reference_modules()),
            str(cases_file),
            str(base),
            str(out_file),
        ],
        capture_output=True,
        text=True,
        timeout=60 + 40 * len(cases),
        env={**os.environ, "NODE_NO_WARNINGS": "1"},
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"the reference driver failed ({proc.returncode}): {proc.stderr[-4000:]}"
        )
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    return {r["id"]: r for r in records}


# -- masks and comparison -----------------------------------------------------------------------

_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")
_GENERATED_ID = re.compile(r"\b(local-fs|local-sandbox)-[a-z0-9]{6,}-[a-z0-9]{4,}")
_PID = re.compile(r"(PID:? |[Pp]id |[Pp]rocess )(\d+)")


def _fixture_times(case: Case) -> set[str]:
    from datetime import datetime

    times = set()
    for e in case.files:
        if "mtime" in e:
            t = datetime.fromtimestamp(e["mtime"], tz=UTC)
            times.add(t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z")
    return times


def mask(text: str, root: str, case: Case) -> str:
    """Hide what legitimately differs between the two runs of one case."""
    keep = _fixture_times(case)
    parent = os.path.dirname(root)
    for r in sorted(
        {root, os.path.realpath(root), parent, os.path.realpath(parent)}, key=len, reverse=True
    ):
        text = text.replace(r, "<DIR>")
    text = _ISO.sub(lambda m: m.group(0) if m.group(0) in keep else "<TIME>", text)
    text = _GENERATED_ID.sub(r"\1-<ID>", text)
    return _PID.sub(lambda m: m.group(1) + "<PID>", text)


def observed(record: dict[str, Any], case: Case) -> list[Any]:
    """A record's calls with the masks applied."""
    out = []
    for c in record["calls"]:
        c = json.loads(json.dumps(c))
        if "message" in c:
            c["message"] = mask(c["message"], record["root"], case)
        for p in c.get("parts", []):
            if "text" in p:
                p["text"] = mask(p["text"], record["root"], case)
            p.pop("fields", None)
        out.append(c)
    return out


@dataclass(frozen=True)
class Deviation:
    """A difference agentvfs keeps on purpose (see docs/differences-from-mastra.md).

    ``applies(call, reference, ours)`` tells whether one call's difference is this one;
    ``changes_disk`` says the reference changed files where agentvfs refused, so the tree the
    case leaves may differ too.
    """

    name: str
    reason: str
    applies: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], bool]
    changes_disk: bool = False


@dataclass
class Outcome:
    """What one call gave on both sides, and the verdict."""

    case: str
    index: int
    call: dict[str, Any]
    reference: dict[str, Any]
    ours: dict[str, Any]
    deviation: str | None

    @property
    def identical(self) -> bool:
        return self.reference == self.ours

    def describe(self) -> str:
        """The call and both answers, cut around where they first differ."""
        r = json.dumps(self.reference, ensure_ascii=False)
        o = json.dumps(self.ours, ensure_ascii=False)
        at = next(
            (i for i, (a, b) in enumerate(zip(r, o, strict=False)) if a != b), min(len(r), len(o))
        )
        start = max(0, at - 300)

        def cut(s: str) -> str:
            return ("…" if start else "") + s[start : at + 500] + ("…" if len(s) > at + 500 else "")

        return (
            f"{self.case} call {self.index} {self.call['tool']}({json.dumps(self.call['input'], ensure_ascii=False)[:300]})\n"
            f"  reference: {cut(r)}\n"
            f"  agentvfs:  {cut(o)}"
        )


def _invalid(out: dict[str, Any]) -> bool:
    return (
        out.get("kind") == "ok"
        and bool(out.get("parts"))
        and out["parts"][0].get("type") == "invalid"
    )


def _validation(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # Both refuse the input; the wording is the schema library's on each side.
    return _invalid(ref) and _invalid(ours)


def _stricter_numbers(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # agentvfs refuses numbers the reference accepts and misreads (depth 0, negative context, ...).
    if not _invalid(ours) or _invalid(ref):
        return False
    numeric = {"maxDepth", "contextLines", "maxCount", "topK", "offset", "limit", "tail", "timeout"}
    return any(k in numeric for k in call_["input"])


def _texts(out: dict[str, Any]) -> list[str]:
    if out.get("kind") == "error":
        return [out["message"]]
    return [p.get("text", "") for p in out.get("parts", [])]


def _python_names(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # Hints name the option as a Python caller spells it (media_types, not mediaTypes).
    fixed = [
        t.replace("`media_types`", "`mediaTypes`").replace("max_media_bytes", "maxMediaBytes")
        for t in _texts(ours)
    ]
    return ref.get("kind") == ours.get("kind") and fixed == _texts(ref)


def _node_errno(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # The reference passes Node's errno text through, host path included; agentvfs says what
    # went wrong in the workspace's terms.
    return (
        ref.get("kind") == "error"
        and ours.get("kind") == "error"
        and bool(re.match(r"E[A-Z]+: ", ref["message"]))
    )


def _regex_wording(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # A bad pattern is reported by each side's regex engine, in its own words.
    prefix = "Error: Invalid regex pattern: "
    r, o = _texts(ref), _texts(ours)
    return len(r) == len(o) == 1 and r[0].startswith(prefix) and o[0].startswith(prefix)


def _bounded_ranges(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # An edit's answer lists a bounded number of line ranges and counts the rest.
    r, o = _texts(ref), _texts(ours)
    m = re.fullmatch(r"(.*), and \d+ more\)", o[0], re.S) if len(o) == 1 else None
    return (
        call_["tool"] == "edit_file"
        and len(r) == 1
        and m is not None
        and r[0].startswith(m.group(1) + ", ")
    )


_TRUNCATED = re.compile(r"\n?\[(?:\.\.\.)?output truncated[^\]]*\]\n?")


def _token_cut(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # Tokens are counted with cl100k (tiktoken), the reference estimates them (tokenx): the cut
    # falls elsewhere, around the same marker.
    r, o = _texts(ref), _texts(ours)
    if len(r) != 1 or len(o) != 1 or not (_TRUNCATED.search(r[0]) or _TRUNCATED.search(o[0])):
        return False
    # A cut inside a character leaves U+FFFD (tokens need not end at a character's end).
    head_r, head_o = (_TRUNCATED.split(t, 1)[0].rstrip("\ufffd") for t in (r[0], o[0]))
    return head_r.startswith(head_o) or head_o.startswith(head_r)


def _root_delete(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # The reference deletes the workspace directory itself; agentvfs refuses.
    path = str(call_["input"].get("path", "")).strip("/")
    return call_["tool"] == "delete" and path in ("", ".", "./") and ours.get("kind") == "error"


def _escaping_link(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # The reference follows a symlink out of the workspace; agentvfs refuses.
    return (
        str(call_["input"].get("path", "")).startswith("link-out") and ours.get("kind") == "error"
    )


def _non_utf8_edit(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # The reference decodes with U+FFFD and writes that back (or finds nothing to replace);
    # agentvfs refuses to edit bytes it cannot decode, and says so.
    o = _texts(ours)
    return call_["tool"] == "edit_file" and len(o) == 1 and " is not valid UTF-8 text " in o[0]


def _never(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    return False  # decided in compare(), which sees the whole tool set


def _directory_time(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # Writes replace a file by renaming a finished copy over it, which dates the directory;
    # the reference writes in place.
    r, o = _texts(ref), _texts(ours)
    if (
        call_["tool"] != "file_stat"
        or len(r) != 1
        or len(o) != 1
        or " Type: directory " not in r[0]
    ):
        return False
    return re.sub(r"Modified: \S+$", "Modified: <TIME>", r[0]) == o[0]


def _silent_exit(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # A background process that exited without output: the reference answers as if it still
    # ran; agentvfs gives its exit code.
    r, o = _texts(ref), _texts(ours)
    exited = len(o) == 1 and re.fullmatch(r"Exit code: -?\d+", o[0]) is not None
    return call_["tool"] == "get_process_output" and r == ["(no output yet)"] and exited


_DROPPED = re.compile(r"\[earlier output dropped: [\d,]+ bytes\]\n")
_TAIL_COUNT = re.compile(r"\[showing last (\d+) of \d+ lines\]")


def _bounded_output(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # A command's output is kept up to a bound (its newest bytes); the reference keeps all of
    # it in memory. Both then show the same last lines.
    r, o = _texts(ref), _texts(ours)
    if len(r) != 1 or len(o) != 1 or not _DROPPED.search(o[0]):
        return False
    same = (
        _TAIL_COUNT.sub(r"[showing last \1 of T lines]", t) for t in (r[0], _DROPPED.sub("", o[0]))
    )
    return next(same) == next(same)


def _spawn_error(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # A command that cannot start: the reference prints execa's error with Node's errno texts
    # and host paths; agentvfs says what is wrong, on stderr, with exit code 1.
    r, o = _texts(ref), _texts(ours)
    return (
        call_["tool"] == "execute_command"
        and len(r) == 1
        and r[0].startswith("Error: Command failed with E")
        and len(o) == 1
        and o[0].startswith("stderr:\nCannot run command: ")
    )


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _split_surrogate(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # A cut at a UTF-16 unit count can fall inside a character beyond U+FFFF; the reference
    # then sends half of its surrogate pair, agentvfs U+FFFD (what Node prints for it too).
    r, o = _texts(ref), _texts(ours)
    return (
        any(_LONE_SURROGATE.search(t) for t in r)
        and [_LONE_SURROGATE.sub("\ufffd", t) for t in r] == o
    )


def _dangling_mkdir(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # mkdir of a name that is a symlink to nothing: the reference says the parent is not
    # found; agentvfs says the name exists (as mkdir -p does), or that it leads outside.
    o = _texts(ours)
    return (
        call_["tool"] == "mkdir"
        and str(call_["input"].get("path", "")).startswith("link-")
        and ref.get("kind") == ours.get("kind") == "error"
        and o[0].startswith(("File already exists: ", "Permission denied: "))
    )


def _pattern_size(call_: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    # A pattern whose counted repeats unroll past the compile bound is refused (the engine
    # would build it in memory); the reference runs it.
    o = _texts(ours)
    return call_["tool"] == "grep" and o[0].startswith(
        "Error: Invalid regex pattern: the pattern expands to"
    )


DEVIATIONS: list[Deviation] = [
    Deviation(
        "bounded-pattern-size",
        "a pattern that unrolls past 100,000 steps is refused",
        _pattern_size,
    ),
    Deviation(
        "dangling-symlink-mkdir",
        "mkdir of a symlink to nothing says the name exists",
        _dangling_mkdir,
    ),
    Deviation(
        "split-surrogate",
        "a cut inside a character beyond U+FFFF gives U+FFFD, not half a pair",
        _split_surrogate,
    ),
    Deviation(
        "bounded-command-output",
        "a command's output is kept up to a bound, its newest bytes",
        _bounded_output,
    ),
    Deviation(
        "spawn-error-text",
        "a command that cannot start is explained without Node's texts",
        _spawn_error,
    ),
    Deviation(
        "silent-exit-code",
        "a finished background process shows its exit code, also without output",
        _silent_exit,
    ),
    Deviation(
        "atomic-write-directory-time",
        "a write renames a finished copy into place, dating its directory",
        _directory_time,
    ),
    Deviation(
        "own-descriptions",
        "tool descriptions are agentvfs's own words for its own behaviour",
        _never,
    ),
    Deviation(
        "workspace-root-delete",
        "deleting the workspace directory itself is refused",
        _root_delete,
        True,
    ),
    Deviation(
        "escaping-symlink", "a symlink out of the workspace is not followed", _escaping_link, True
    ),
    Deviation(
        "non-utf8-edit",
        "a file that is not UTF-8 is not rewritten with U+FFFD",
        _non_utf8_edit,
        True,
    ),
    Deviation(
        "bounded-edit-ranges",
        "an edit's answer lists a bounded number of line ranges",
        _bounded_ranges,
    ),
    Deviation(
        "token-count", "tokens are counted with cl100k, so output is cut elsewhere", _token_cut
    ),
    Deviation(
        "python-option-names",
        "hints spell options as Python callers do (media_types)",
        _python_names,
    ),
    Deviation("node-errno-text", "no raw Node errno texts with host paths", _node_errno),
    Deviation(
        "regex-error-wording", "pattern errors are worded by the regex engine", _regex_wording
    ),
    Deviation(
        "validation-wording", "input errors are worded by each side's schema checker", _validation
    ),
    Deviation(
        "stricter-numbers", "numbers the reference silently misreads are refused", _stricter_numbers
    ),
]


#: What a JSON schema says of the values it takes (not its words: descriptions are our own).
_SCHEMA_KEYS = (
    "type",
    "enum",
    "default",
    "minimum",
    "maximum",
    "items",
    "properties",
    "required",
    "anyOf",
)
#: The largest safe JavaScript integer, which the reference states as every integer's maximum.
_JS_MAX_SAFE_INTEGER = 2**53 - 1


def _shape(schema: Any) -> Any:
    """The part of a JSON schema that decides what input is valid, in a canonical form."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key in _SCHEMA_KEYS:
        if key not in schema or (key == "maximum" and schema[key] == _JS_MAX_SAFE_INTEGER):
            continue
        value = schema[key]
        if key == "properties":
            value = {name: _shape(sub) for name, sub in value.items()}
        elif key in ("items",):
            value = _shape(value)
        elif key == "anyOf":
            value = [_shape(v) for v in value]
        elif key == "required":
            value = sorted(value)
            if not value:
                continue  # an empty list says what no list says
        out[key] = value
    return _merge_alternatives(out)


def _merge_alternatives(out: dict[str, Any]) -> dict[str, Any]:
    """{"anyOf": [{"type": a}, {"type": b, ...}]} as {"type": [a, b], ...}, which says the same."""
    alternatives = out.get("anyOf")
    if alternatives and all(
        set(v) <= {"type", "items"} and isinstance(v.get("type"), str) for v in alternatives
    ):
        del out["anyOf"]
        out["type"] = [v["type"] for v in alternatives]
        for v in alternatives:
            if "items" in v:
                out["items"] = v["items"]
    if isinstance(out.get("type"), list):
        out["type"] = out["type"][0] if len(out["type"]) == 1 else sorted(out["type"])
    return out


def _numbers_loosely(shape: Any) -> Any:
    """``shape`` with what it says of numbers reduced to "a number, or nothing": integer or
    any number, bounds, a numeric string and null (an absent value) all taken alike."""
    if isinstance(shape, list):
        return [_numbers_loosely(v) for v in shape]
    if not isinstance(shape, dict):
        return shape
    out = {k: _numbers_loosely(v) for k, v in shape.items()}
    out = _merge_alternatives(out)
    types = out.get("type")
    kinds = set(types) if isinstance(types, list) else {types}
    if kinds & {"number", "integer"}:
        out["type"] = "number"
        out.pop("minimum", None)
        out.pop("maximum", None)
    return out


def _schemas(named: list[list[Any]]) -> list[list[Any]]:
    return [[name, _shape(schema)] for name, schema in named]


def _aspects(reference: dict[str, Any], ours: dict[str, Any]) -> Iterable[tuple[str, Any, Any]]:
    """What a case compares beside its calls: the hook log, and what ``inspect`` gathered."""
    if reference.get("hooks") or ours.get("hooks"):
        yield "hooks", reference.get("hooks"), ours.get("hooks")
    r, o = reference.get("inspected") or {}, ours.get("inspected") or {}
    if not (r or o):
        return
    # The tool set (exposed names, ids, approval) is matched exactly; descriptions are our own.
    yield "toolset", [t[:3] for t in r.get("toolset", [])], [t[:3] for t in o.get("toolset", [])]
    yield (
        "descriptions",
        [[t[0], t[3]] for t in r.get("toolset", [])],
        [[t[0], t[3]] for t in o.get("toolset", [])],
    )
    yield "schemas", _schemas(r.get("schemas", [])), _schemas(o.get("schemas", []))
    yield "instructions", r.get("instructions"), o.get("instructions")
    yield "info", r.get("info"), o.get("info")


def compare(case: Case, reference: dict[str, Any], ours: dict[str, Any]) -> list[Outcome]:
    """One :class:`Outcome` per call, plus one for the tree left on disk (index -1)."""
    ref_calls, our_calls = observed(reference, case), observed(ours, case)
    outcomes = []
    for i, c in enumerate(case.calls):
        r = ref_calls[i] if i < len(ref_calls) else {"kind": "missing"}
        o = our_calls[i] if i < len(our_calls) else {"kind": "missing"}
        deviation = None
        if r != o:
            deviation = next((d.name for d in DEVIATIONS if d.applies(c, r, o)), None)
        outcomes.append(Outcome(case.id, i, c, r, o, deviation))
    for extra in ref_calls[len(case.calls) :] + our_calls[len(case.calls) :]:
        outcomes.append(
            Outcome(case.id, len(case.calls), {"tool": "setup", "input": {}}, extra, {}, None)
        )
    r_tree = [[mask(x, reference["root"], case) for x in e] for e in reference["tree"]]
    o_tree = [[mask(x, ours["root"], case) for x in e] for e in ours["tree"]]
    for what, r_val, o_val in _aspects(reference, ours):
        r_val = json.loads(mask(json.dumps(r_val), reference["root"], case))
        o_val = json.loads(mask(json.dumps(o_val), ours["root"], case))
        item = Outcome(case.id, -2, {"tool": what, "input": {}}, {what: r_val}, {what: o_val}, None)
        if not item.identical and what == "descriptions":
            same_tools = [k for k, _ in r_val] == [k for k, _ in o_val]
            item.deviation = "own-descriptions" if same_tools else None
        if (
            not item.identical
            and what == "schemas"
            and _numbers_loosely(r_val) == _numbers_loosely(o_val)
        ):
            item.deviation = "stricter-numbers"
        outcomes.append(item)
    on_disk = {d.name for d in DEVIATIONS if d.changes_disk}
    follows = next((o.deviation for o in outcomes if o.deviation in on_disk), None)
    tree = Outcome(
        case.id, -1, {"tool": "tree", "input": {}}, {"tree": r_tree}, {"tree": o_tree}, None
    )
    tree.deviation = follows if not tree.identical else None
    outcomes.append(tree)
    return outcomes


def run_both(cases: Sequence[Case], base: Path) -> list[Outcome]:
    """Run ``cases`` on both sides (separate directories under ``base``) and compare them.

    The reference's Node process runs while agentvfs runs the same cases here: neither side
    sees the other's directory, and each waits mostly on its own commands."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(run_reference, cases, base / "reference")
        ours = run_here(cases, base / "agentvfs")
        reference = pending.result()
    return [o for c in cases for o in compare(c, reference[c.id], ours[c.id])]


def summary(outcomes: Iterable[Outcome]) -> dict[str, Any]:
    """Counts over the calls (identical, per deviation, unexplained), and the other checks (the
    tree left on disk, the hook log, the tool set, instructions and info) that are unexplained."""
    outcomes = list(outcomes)
    calls = [o for o in outcomes if o.index >= 0]
    per: dict[str, int] = {}
    for o in outcomes:
        if not o.identical and o.deviation:
            per[o.deviation] = per.get(o.deviation, 0) + 1
    return {
        "calls": len(calls),
        "identical": sum(o.identical for o in calls),
        "deviations": per,
        "unexplained": sum(not o.identical and not o.deviation for o in calls),
        "other_checks": len(outcomes) - len(calls),
        "other_unexplained": sum(
            not o.identical and not o.deviation for o in outcomes if o.index < 0
        ),
    }
