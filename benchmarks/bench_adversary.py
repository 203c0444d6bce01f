"""The adversarial suite's totals: every registered attack, its tries and how many held.

Runs each attack of ``agentvfs.testing`` once in a fresh arena with its iterations multiplied
by ``--scale`` (``AGENTVFS_ATTACK_SCALE``), as the user running this script; with ``--user
NAME`` (as root) it runs again as that user in a child process and reports both. Prints a
Markdown table (attack, severity, runs-as, tries, held, seconds) and the totals; ``--json``
writes the rows.

Usage: ``python benchmarks/bench_adversary.py [--scale 5] [--user nobody] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent


async def _run_all(only: list[str]) -> list[dict[str, Any]]:
    from agentvfs.testing import ATTACKS, load_attacks, requirement_missing, run_attack

    load_attacks()
    rows: list[dict[str, Any]] = []
    who = pwd.getpwuid(os.geteuid()).pw_name
    for name in sorted(ATTACKS):
        if only and name not in only:
            continue
        attack = ATTACKS[name]
        missing = requirement_missing(attack.requires)
        row: dict[str, Any] = {"attack": name, "severity": attack.severity, "user": who}
        if missing is not None:
            row.update(skipped=missing, attempts=0, held=0, seconds=0.0, failures=[])
        else:
            try:
                report = await run_attack(attack)
            except Exception as exc:  # an attack that could not be carried out is reported
                row.update(error=f"{type(exc).__name__}: {exc}", attempts=0, held=0, seconds=0.0, failures=[])
            else:
                row.update(attempts=report.attempts, held=report.held, seconds=round(report.seconds, 1),
                           failures=report.failures[:3])  # fmt: skip
        rows.append(row)
        print(f"  {name} ({row['user']}): {row['held']}/{row['attempts']}", file=sys.stderr, flush=True)
    return rows


def _as_user(user: str, scale: float, only: list[str]) -> list[dict[str, Any]]:
    home = tempfile.mkdtemp(prefix="agentvfs-adversary-home-")
    os.chown(home, pwd.getpwnam(user).pw_uid, -1)
    out = Path(home) / "rows.json"
    script = REPO / "benchmarks" / "bench_adversary.py"
    argv = [sys.executable, str(script), "--scale", str(scale), "--json", str(out), "--quiet", *(["--only", *only] if only else [])]
    env = ["env", "-i", f"PATH={os.environ.get('PATH', '')}", f"HOME={home}", "PYTHONDONTWRITEBYTECODE=1"]
    subprocess.run(["runuser", "-u", user, "--", *env, *argv], cwd=REPO, check=False)
    try:
        return list(json.loads(out.read_text()))
    except (OSError, ValueError):
        return [{"attack": "(all)", "severity": "-", "user": user, "error": "the run as this user failed",
                 "attempts": 0, "held": 0, "seconds": 0.0, "failures": []}]  # fmt: skip


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| attack | severity | user | tries | held | seconds |", "|---|---|---|---|---|---|"]
    for row in rows:
        note = f" ({row['skipped']})" if row.get("skipped") else f" ({row['error']})" if row.get("error") else ""
        lines.append(
            f"| {row['attack']}{note} | {row['severity']} | {row['user']} | {row['attempts']:,} | "
            f"{row['held']:,} | {row['seconds']} |"
        )
    for user in sorted({r["user"] for r in rows}):
        mine = [r for r in rows if r["user"] == user]
        ran = [r for r in mine if r["attempts"]]
        lines.append(
            f"| **all, {user}** | | {user} | **{sum(r['attempts'] for r in mine):,}** | "
            f"**{sum(r['held'] for r in mine):,}** | {sum(r['seconds'] for r in mine):.0f} "
            f"({len(ran)} attacks run, {len(mine) - len(ran)} skipped) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=5.0, help="multiply every attack's iterations")
    parser.add_argument("--user", default=None, help="also run as this user (needs root and runuser)")
    parser.add_argument("--only", nargs="*", default=[], help="attack names to run (default: all)")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--quiet", action="store_true", help="no table (for the run as another user)")
    args = parser.parse_args()
    os.environ["AGENTVFS_ATTACK_SCALE"] = str(args.scale)
    rows = anyio.run(_run_all, args.only)
    if args.user:
        rows += _as_user(args.user, args.scale, args.only)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if not args.quiet:
        print(f"scale {args.scale:g} (AGENTVFS_ATTACK_SCALE)\n")
        print(_table(rows))


if __name__ == "__main__":
    main()
