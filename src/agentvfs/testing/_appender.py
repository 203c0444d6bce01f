"""A process that appends numbered lines to a file one ``open``/``close`` at a time and says
which closes succeeded: the writer of the two-mounts tests and benchmarks (run as
``python -m agentvfs.testing._appender PATH TAG COUNT``; its standard output is one JSON
object mapping each line to ``"ok"`` or the error its writer was told)."""

from __future__ import annotations

import json
import sys

__all__ = ["appender_command"]


def appender_command(path: str, tag: str, count: int) -> list[str]:
    """The command line of a process that appends ``count`` lines (``f"{tag}{i}\\n"``) to
    ``path``, each in its own ``open(path, "a")`` and ``close``.

    It prints one JSON object: each line mapped to ``"ok"`` when its close succeeded, else
    to the ``strerror`` of the error raised (``"Input/output error"`` for a publish that lost
    to another writer).
    """
    return [sys.executable, "-m", __name__, path, tag, str(count)]


def _append(path: str, tag: str, count: int) -> dict[str, str]:
    outcome: dict[str, str] = {}
    for i in range(count):
        line = f"{tag}{i}\n"
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line)
            outcome[line] = "ok"
        except OSError as exc:
            outcome[line] = exc.strerror or str(exc)
    return outcome


if __name__ == "__main__":
    print(json.dumps(_append(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
