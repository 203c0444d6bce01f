"""Value objects of command execution."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CommandResult"]


@dataclass(frozen=True, slots=True)
class CommandResult:
    """The outcome of one command.

    ``success`` is ``exit_code == 0``. A command that ran past its timeout has
    ``exit_code == 124`` with ``timed_out`` and ``killed`` set; one killed by a signal has
    ``exit_code == 128``; one that could not be started has ``exit_code == 1`` and the reason
    in ``stderr``. ``stdout``/``stderr`` hold the retained output (the newest
    ``max_retained_bytes`` of it): ``*_truncated`` says older output was dropped and
    ``*_dropped_bytes`` how many UTF-8 bytes. ``command`` is the full command line that ran
    and ``args`` the arguments it was built from (set by ``execute_command``).
    """

    success: bool
    exit_code: int
    stdout: str
    stderr: str
    execution_time_ms: int
    timed_out: bool = False
    killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    command: str | None = None
    args: tuple[str, ...] | None = None
    stdout_dropped_bytes: int = 0
    stderr_dropped_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return the result as a JSON-friendly dict (``args`` as a list)."""
        data = asdict(self)
        if self.args is not None:
            data["args"] = list(self.args)
        return data
