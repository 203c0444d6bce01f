"""Attacks on the tools' bounds: regex bombs, huge and sparse files, FIFOs, floods of output."""

from __future__ import annotations

__all__: list[str] = []
