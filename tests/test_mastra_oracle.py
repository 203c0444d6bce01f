"""agentvfs's tools against the reference implementation, call by call (tests/_oracle.py).

Every call of every case must give the model the same bytes on both sides, or differ in a
way listed in ``_oracle.DEVIATIONS`` (each one documented in docs/differences-from-mastra.md).
``--oracle-cases N`` sets how many random cases each seed draws.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _oracle import (
    DEVIATIONS,
    Case,
    Outcome,
    call,
    compare,
    file,
    reference_missing,
    reference_modules,
    run_both,
    summary,
)
from _oracle_cases import hand_cases, random_cases

ROOT = Path(__file__).resolve().parent.parent
needs_reference = pytest.mark.skipif(
    reference_missing() is not None, reason=str(reference_missing())
)


def _fail_on_unexplained(outcomes: list[Outcome]) -> None:
    bad = [o for o in outcomes if not o.identical and not o.deviation]
    counts = summary(outcomes)
    assert not bad, f"{len(bad)} unexplained differences ({counts}):\n\n" + "\n\n".join(
        o.describe() for o in bad[:25]
    )


@needs_reference
def test_reference_is_the_pinned_release() -> None:
    lock = json.loads((ROOT / "tests" / "oracle" / "package-lock.json").read_text())
    installed = json.loads(
        (reference_modules() / "node_modules" / "@mastra" / "core" / "package.json").read_text()
    )
    assert (
        installed["version"] == lock["packages"]["node_modules/@mastra/core"]["version"] == "1.71.0"
    )


@needs_reference
def test_hand_written_cases(tmp_path: Path) -> None:
    outcomes = run_both(hand_cases(), tmp_path)
    assert summary(outcomes)["calls"] > 100
    _fail_on_unexplained(outcomes)


@needs_reference
@pytest.mark.parametrize("seed", [1, 2])
def test_random_cases(seed: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    count = request.config.getoption("--oracle-cases")
    outcomes = run_both(random_cases(seed, count), tmp_path)
    _fail_on_unexplained(outcomes)


# -- the comparison itself, without the reference -----------------------------------------------


def _record(root: str, *texts: str, tree: list[list[str]] | None = None) -> dict[str, object]:
    calls = [{"kind": "ok", "parts": [{"type": "text", "text": t}]} for t in texts]
    return {"id": "c", "root": root, "calls": calls, "tree": tree or [["ws", "dir", ""]]}


def _case(n: int = 1) -> Case:
    return Case("c", [file("a.txt", "x", age=3)], [call("read_file", path="a.txt")] * n)


def test_masks_hide_only_what_differs_between_runs() -> None:
    case = _case(3)
    fixture_time = "2023-11-14T22:13:23.000Z"  # T0 + 3, the fixture's own time, is kept
    ref = _record(
        "/r/c/ws", "cwd /r/c/ws", "(PID: 12) at 2026-12-04T10:00:00.123Z", f"a.txt {fixture_time}"
    )
    ours = _record(
        "/o/c/ws", "cwd /o/c/ws", "(PID: 99) at 2026-12-04T10:00:01.456Z", f"a.txt {fixture_time}"
    )
    assert all(o.identical for o in compare(case, ref, ours))
    ours_moved = _record(
        "/o/c/ws",
        "cwd /o/c/ws",
        "(PID: 99) at 2026-12-04T10:00:01.456Z",
        "a.txt 2023-11-14T22:13:24.000Z",
    )
    assert [o.identical for o in compare(case, ref, ours_moved)] == [True, True, False, True]


def test_a_different_byte_is_a_failure() -> None:
    case = _case()
    outcomes = compare(case, _record("/r", "a.txt (1 bytes)"), _record("/o", "a.txt (1 bytes) "))
    assert [o.deviation for o in outcomes if not o.identical] == [None]
    assert summary(outcomes)["unexplained"] == 1
    tree = compare(
        case,
        _record("/r", "x"),
        _record("/o", "x", tree=[["ws", "dir", ""], ["ws/b", "file", "0"]]),
    )
    assert not tree[-1].identical and tree[-1].deviation is None


@pytest.mark.parametrize(
    ("reference", "ours", "expected"),
    [
        # A Node errno text against a workspace error: deliberate.
        (
            {"kind": "error", "message": "EISDIR: illegal operation on a directory, open '/x'"},
            {"kind": "error", "message": "Path is a directory: x"},
            "node-errno-text",
        ),
        # Any other error text is not.
        (
            {"kind": "error", "message": "File not found: x"},
            {"kind": "error", "message": "Not found: x"},
            None,
        ),
        # Both refuse the input, in their own words.
        (
            {"kind": "ok", "parts": [{"type": "invalid", "text": "Tool input validation failed"}]},
            {
                "kind": "ok",
                "parts": [{"type": "invalid", "text": "field 'offset' must be at least 1"}],
            },
            "validation-wording",
        ),
        # agentvfs refusing a non-numeric field the reference accepts is not covered.
        (
            {"kind": "ok", "parts": [{"type": "text", "text": "ok"}]},
            {"kind": "ok", "parts": [{"type": "invalid", "text": "bad path"}]},
            None,
        ),
        (
            {
                "kind": "ok",
                "parts": [
                    {
                        "type": "text",
                        "text": "Error: Invalid regex pattern: Invalid regular expression: /(/g",
                    }
                ],
            },
            {
                "kind": "ok",
                "parts": [{"type": "text", "text": "Error: Invalid regex pattern: missing )"}],
            },
            "regex-error-wording",
        ),
        # A pattern one side accepts and the other refuses is not a wording difference.
        (
            {
                "kind": "ok",
                "parts": [{"type": "text", "text": "Error: Invalid regex pattern: Invalid group"}],
            },
            {"kind": "ok", "parts": [{"type": "text", "text": "1 match across 1 file"}]},
            None,
        ),
    ],
)
def test_each_deviation_covers_only_its_cause(
    reference: dict[str, object], ours: dict[str, object], expected: str | None
) -> None:
    c = call("read_file", path="a.txt")
    found = next((d.name for d in DEVIATIONS if d.applies(c, reference, ours)), None)
    assert found == expected


def test_every_deviation_is_documented() -> None:
    page = (ROOT / "docs" / "differences-from-mastra.md").read_text()
    for d in DEVIATIONS:
        assert f"`{d.name}`" in page, f"{d.name} is not in docs/differences-from-mastra.md"
