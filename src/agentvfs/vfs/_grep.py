"""Line-oriented regular-expression search with a time budget, shared by the grep tool and
the backends' ``grep``.

Patterns run on the ``regex`` package, not ``re``: the same syntax and results for ordinary
patterns (its ``VERSION0`` mode is ``re``-compatible), but every match call takes a
``timeout`` and releases the GIL (``concurrent=True``). A pattern that backtracks
exponentially, ``(a|aa)+$`` on a line of ``a``, therefore stops when the search's budget is
spent instead of holding the interpreter for hours, and other threads (the event loop) keep
running meanwhile. ``benchmarks/bench_regex.py`` compares it with RE2 and ``re``.

Matching is bounded three ways:

* time: a :class:`BoundedPattern` carries a budget of wall-clock seconds
  (:data:`DEFAULT_MATCH_TIMEOUT` by default) for all its match calls together, counted on
  :func:`time.monotonic` around each call; once it is spent, :class:`MatchTimeout` is raised.
  ``regex`` counts its ``timeout`` in CPU time of the whole process, which a busy machine
  stretches to several times as much wall-clock time, so a call here gets at most
  :data:`MATCH_SLICE` of it; a call that needs more is run again in a child process
  (:mod:`._matcher`), killed when the budget is spent, and the pattern's later calls go there
  too. Matching therefore ends within the slice's share of the CPU after its budget, however
  loaded the machine is, and leaves nothing running (listing and reading are the caller's to
  bound);
* line length: only the first :data:`MATCH_LINE_LIMIT` characters of a line are matched;
* pattern size: a pattern whose repeats would expand to more than
  :data:`MAX_PATTERN_EXPANSION` steps is refused before compiling (``regex`` unrolls
  ``(?:a{1000}){1000}`` into a million nodes, about 270 MB, and doubles ``(?:X)+`` at every
  level it is nested). The estimate follows regex's reading of parentheses, sets and
  escapes; comments ``(?#...)`` and the flags that change the reading of the rest (``x``,
  ``V0``, ``V1``) or multiply its size (``f``) are refused, as JavaScript has none of them.

Most lines do not match, so a file's lines are searched as one block (one call per matching
line rather than one per line) whenever that gives the same answer as searching line by
line; see :func:`search_mode`.
"""

from __future__ import annotations

import itertools
import logging
import string
import threading
import time
from dataclasses import dataclass
from typing import Literal

import regex

from ..errors import MatchTimeout
from ._matcher import Matcher, MatcherDied, matcher_supported
from ._records import GrepFileResult, GrepMatch

__all__ = [
    "DEFAULT_MATCH_TIMEOUT",
    "MATCH_LINE_LIMIT",
    "MATCH_SLICE",
    "MAX_PATTERN_EXPANSION",
    "BoundedPattern",
    "LineChunker",
    "PatternError",
    "compile_pattern",
    "grep_lines",
    "search_mode",
]

_log = logging.getLogger("agentvfs")

#: Wall-clock seconds one search may spend matching, over all its files.
DEFAULT_MATCH_TIMEOUT = 5.0
#: CPU seconds (of the process, as ``regex`` counts them) one match call may take in this
#: process; a call that needs more runs in a matcher process. Even with a tenth of a core
#: it is half a second of wall-clock time, and a hundred times what a 16 KiB window of an
#: ordinary pattern takes.
MATCH_SLICE = 0.05
#: Characters of a line that are matched; the rest of a longer line is not searched.
MATCH_LINE_LIMIT = 1 << 20
#: Steps a pattern may expand to when its counted repeats are unrolled.
MAX_PATTERN_EXPANSION = 100_000

#: ``regex`` raises this for a bad pattern (``re.error`` has the same role).
PatternError = regex.error

# Characters of a block searched per call (rounded up to whole lines).
_WINDOW = 16 * 1024


# Escapes of one character that is never "\n" (outside a class; \b there is a boundary).
_SAFE_LETTER_ESCAPES = frozenset("dwbBtrfvag")
# The character some escapes stand for, to check ranges in classes against "\n".
_ESCAPED_CHARS = {"t": 9, "r": 13, "f": 12, "v": 11, "a": 7, "b": 8}
_OCTAL = "01234567"


def _escape_code(source: str, i: int) -> tuple[int | None, int]:
    """The code point of the escape at ``source[i]`` (a backslash) when it stands for one
    character, else None; and the index after it."""
    kind = source[i + 1 : i + 2]
    digits = {"x": 2, "u": 4, "U": 8}.get(kind)
    if digits is not None:
        text = source[i + 2 : i + 2 + digits]
        if len(text) == digits and all(c in "0123456789abcdefABCDEF" for c in text):
            return int(text, 16), i + 2 + digits
        return None, i + 2
    # Octal as Python reads it: \0 and up to two more digits, or three octal digits; other
    # digits are backreferences.
    if kind == "0":
        more = "".join(itertools.takewhile(lambda c: c in _OCTAL, source[i + 2 : i + 4]))
        return int("0" + more, 8), i + 2 + len(more)
    three = source[i + 1 : i + 4]
    if len(three) == 3 and all(c in _OCTAL for c in three):
        return int(three, 8), i + 4
    if kind in _ESCAPED_CHARS:
        return _ESCAPED_CHARS[kind], i + 2
    if kind and not kind.isalnum():
        return ord(kind), i + 2
    return None, i + 2


def _newline_free(source: str) -> bool:
    """Whether ``source`` can never match a string holding ``"\\n"`` (read conservatively:
    ``\\s``, ``\\W``, ``\\D``, ``\\p``, negated classes, classes whose ranges span ``"\\n"``
    and escapes it does not know all count as possible newlines).

    Lookaround, atomic groups and possessive quantifiers of such a pattern decide the same
    inside a block of lines as on the line alone: what they look at or keep never reaches
    past the newline.
    """
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "\n":
            return False
        if c == "\\":
            kind = source[i + 1 : i + 2]
            code, after = _escape_code(source, i)
            if code is None and not (kind in _SAFE_LETTER_ESCAPES or kind.isdigit()):
                return False  # \s \S \W \D \p \P \X \N \h ... (digits: backreferences)
            if code == 10:
                return False
            i = after
            continue
        if c == "[":
            j = i + 1
            if source[j : j + 1] == "^":
                return False
            first = True
            while j < n and (source[j] != "]" or first):
                first = False
                if source.startswith("[:", j):
                    return False  # POSIX classes such as [:space:]
                if source[j] == "\\":
                    kind = source[j + 1 : j + 2]
                    low, j = _escape_code(source, j)
                    if low is None:
                        if kind not in ("d", "w"):
                            return False
                        continue
                else:
                    low, j = ord(source[j]), j + 1
                if source[j : j + 1] == "-" and source[j + 1 : j + 2] not in ("]", ""):
                    if source[j + 1] == "\\":
                        high, j = _escape_code(source, j + 1)
                        if high is None:
                            return False
                    else:
                        high, j = ord(source[j + 1]), j + 2
                    if low <= 10 <= high:
                        return False
                elif low == 10:
                    return False
            i = j + 1
            continue
        i += 1
    return True


@dataclass(frozen=True, slots=True)
class _Shape:
    """What :func:`_scan` learns about a pattern."""

    #: A pattern that matches a line wherever ``source`` does (possibly more), safe to search
    #: a block of lines with; None when the lines must be searched one by one.
    block: str | None
    #: ``block`` is ``source`` itself: a block match inside one line is that line's answer.
    exact: bool
    #: Steps the pattern expands to when its counted repeats are unrolled.
    expansion: int
    #: Why the pattern is refused before compiling (syntax the estimate cannot follow), or None.
    refused: str | None = None


# Inline flags as regex reads them after "(?" ("V0" and "V1" are one flag each).
_FLAG_NAMES = frozenset({"V0", "V1", *"abefiLmprsuwx"})
# Flags refused when turned on: "x" makes whitespace and "#..." comments vanish (a ")" in a
# comment closes nothing), "V0"/"V1" switch to the other syntax (V1 nests sets), and "f"
# (full case folding) compiles "ß" as a branch of spellings, several steps each.
_REFUSED_FLAGS = {
    "x": "the verbose flag (?x) is not supported (JavaScript has none); write the pattern without it",
    "V0": "the version flags (?V0) and (?V1) are not supported (JavaScript has none); write the pattern without them",
    "V1": "the version flags (?V0) and (?V1) are not supported (JavaScript has none); write the pattern without them",
    "f": "the full case-folding flag (?f) is not supported (JavaScript has none); write the pattern without it",
}
_COMMENT = "comments (?#...) are not supported (JavaScript has none); remove the comment"
# What regex reads as a property name inside "[:...:]", and as the value after "=" or ":".
_PROPERTY_NAME = frozenset(string.ascii_letters + string.digits + " &_-.")
_PROPERTY_VALUE = _PROPERTY_NAME | {"/"}
# Escapes that compile to several nodes: \R (a line ending: "\r\n" or one of seven
# characters) and \X (a grapheme cluster); measured at 1.7 KB and 1.3 KB a step.
_HEAVY_ESCAPES = {"R": 8, "X": 6}
# A group called by number or name may be compiled again, reversed (in a lookbehind) and
# fuzzy: at most four copies of every group.
_CALL_COPIES = 4
_COUNT = regex.compile(r"([0-9]*)(,([0-9]*))?")


def _read_flags(source: str, i: int) -> tuple[list[str], int]:
    """The inline flags at ``source[i]`` as regex reads them, and the index after them."""
    flags: list[str] = []
    while True:
        token = source[i : i + 2] if source.startswith("V", i) else source[i : i + 1]
        if token not in _FLAG_NAMES:
            return flags, i
        flags.append(token)
        i += len(token)


def _flag_group(source: str, i: int) -> tuple[list[str], str, int] | None:
    """The inline flag group opening at ``source[i]`` (``"(?"``): the flags it turns on,
    ``":"`` (a group with scoped flags) or ``")"`` (flags for the rest of the enclosing
    group), and the index after that; None when ``source[i:]`` is no flag group (then it is
    some other construct, or regex refuses it)."""
    on, j = _read_flags(source, i + 2)
    if source.startswith("-", j):
        off, j = _read_flags(source, j + 1)
        if not off:
            return None
    end = source[j : j + 1]
    if end not in (":", ")"):
        return None
    return on, end, j + 1


def _is_call(after: str) -> bool:
    """Whether the two characters after ``(?`` open a call to a group: ``(?R)``, ``(?1)``,
    ``(?+1)``, ``(?-1)``, ``(?&name)``, ``(?P>name)``."""
    head = after[:1]
    return head in ("R", "&") or head.isdigit() or after == "P>" or (head in ("+", "-") and after[1:2].isdigit())


def _posix_end(source: str, i: int) -> int | None:
    """The index after the POSIX class ``[:name:]`` opening at ``source[i]`` inside a set,
    read as regex reads it (``[:^name:]``, ``[:name=value:]``), or None when regex takes
    the ``[`` as a plain member."""
    n = len(source)
    j = i + 2
    if source.startswith("^", j):
        j += 1
    while j < n and source[j] in _PROPERTY_NAME:
        j += 1
    if j < n and source[j] in ":=":
        k = j + 1
        while k < n and source[k] in _PROPERTY_VALUE:
            k += 1
        if source[j + 1 : k].strip():
            j = k  # a qualified name; else the ":" is the start of ":]"
    return j + 2 if source.startswith(":]", j) else None


def _class_end(source: str, i: int) -> int:
    """The index after the character set opening at ``source[i]`` (``"["``), read as regex's
    VERSION0 parser reads it: a ``]`` first (after any ``^``) is a member, ``[:name:]`` is one
    member, any other ``[`` and every parenthesis are plain members, and an escape is a
    backslash and one character (the rest of ``\\x41`` or ``\\p{L}`` holds no ``]``)."""
    n = len(source)
    j = i + 1
    if source.startswith("^", j):
        j += 1
    first = True
    while j < n:
        c = source[j]
        if c == "]" and not first:
            return j + 1
        first = False
        if c == "\\":
            j += 2
        elif source.startswith("[:", j):
            j = _posix_end(source, j) or j + 1
        else:
            j += 1
    return n  # unterminated: regex refuses it


def _scan(source: str) -> _Shape:
    """Read ``source`` once: the block form of :func:`search_mode` and the expansion estimate.

    The block form errs towards searching line by line: anything the reading does not
    recognise (inline flags, verbs, conditionals, fuzzy constraints) gives none, which is
    only slower.

    The expansion must never fall below what ``regex`` builds, so the reading follows
    regex's own parser (VERSION0) wherever a parenthesis, bracket or brace may or may not be
    structure: escapes, sets (a ``)`` or ``[:name:]`` inside), named groups, lookbehind,
    inline flags (``(?i)`` is no item: a quantifier after it repeats what came before, as
    in regex), calls and quantifier suffixes. What it cannot follow is refused instead
    (:attr:`_Shape.refused`): comments and the flags that change how the rest is read.

    regex unrolls counted repeats when it compiles: ``X{n}`` holds ``n`` copies of ``X``, and
    ``X{n,m}`` (``m`` larger or unbounded, so ``X+`` too) ``n`` copies and one more for the
    rest, so nested ``(?:X)+`` doubles at every level. The estimate multiplies the same way
    and adds a step per open-ended repeat and per group that is a node of its own (all but
    ``(?:...)``); a set weighs a step per three characters of its text (each range or class in
    it is a node of its own). One step is at most 512 bytes of compiled pattern (measured in
    ``tests/test_tools_bounds.py``).
    """
    out: list[str] = []
    unsafe = removed = backrefs = calls = False
    # A pattern that never matches "\n" keeps lookaround, atomic groups and possessive
    # quantifiers as they are: they behave the same in a block as on one line.
    free = _newline_free(source)
    depth = 0
    skipping: int | None = None  # the depth of the lookaround being left out
    # Per open group: [weight so far, weight of the last item, steps of the group's own node:
    # 0 for (?:...), 1 for captures, lookaround and the like].
    stack: list[list[int]] = [[0, 0, 0]]
    i, n = 0, len(source)

    def emit(text: str) -> None:
        if skipping is None:
            out.append(text)

    def item(weight: int) -> None:
        stack[-1][0] += weight
        stack[-1][1] = weight

    def repeat(low: int, high: int | None) -> None:
        top = stack[-1]
        # Exact: that many copies. Open-ended: the minimum's copies, one for the rest (none
        # when the minimum is 0: then the repeat holds the only copy), and the repeat's node.
        copies = max(low, 1) if high == low else (low + 1 if low else 1)
        grown = top[1] * copies + (0 if high == low else 2)
        top[0] += grown - top[1]
        top[1] = grown

    while i < n:
        c = source[i]
        if c == "\\":
            after = source[i + 1 : i + 2]
            # Anchors tied to the string's ends, \G, \K (resets the start) and \X (a
            # grapheme may span "\r\n") behave differently inside a block of lines.
            if after and after in "AZzGKX":
                unsafe = True
            if (after.isdigit() and after != "0") or after == "g":
                backrefs = True
            emit(source[i : i + 2])
            item(_HEAVY_ESCAPES.get(after, 1))
            i += 2
            continue
        if c == "[":
            j = _class_end(source, i)
            emit(source[i:j])
            item(1 + (j - i) // 3)
            i = j
            continue
        if c == "(":
            opener = "("
            skip: int | None = None  # characters the opener takes, when not len(opener)
            if source.startswith("(*", i):
                unsafe = True  # backtracking verbs such as (*PRUNE)
            elif source.startswith("(?#", i):
                return _Shape(None, False, 0, _COMMENT)
            elif source.startswith("(?", i):
                after = source[i + 2 : i + 4]
                flags = _flag_group(source, i)
                if _is_call(after):
                    unsafe = calls = True
                elif flags is not None:
                    on, end, after_flags = flags
                    for flag in on:
                        if flag in _REFUSED_FLAGS:
                            return _Shape(None, False, 0, _REFUSED_FLAGS[flag])
                    if end == ")":
                        # Flags for the rest of the group: no item of its own.
                        unsafe = True
                        i = after_flags
                        continue
                    if on or source[i + 2] != ":":
                        unsafe = True
                    opener = source[i:after_flags]
                elif after == "P=":
                    backrefs = True
                    close = source.find(")", i)
                    emit(source[i : close + 1] if close >= 0 else source[i:])
                    item(1)
                    i = close + 1 if close >= 0 else n
                    continue
                elif after == "P<" or (after[:1] == "<" and after[1:2] not in ("=", "!")):
                    close = source.find(">", i)
                    opener = source[i : close + 1] if close >= 0 else source[i:]
                elif free and (after[:1] in ("=", "!", ">") or after in ("<=", "<!")):
                    opener = source[i : i + (4 if after in ("<=", "<!") else 3)]
                elif after[:1] in ("=", "!") or after in ("<=", "<!"):
                    # Lookaround sees past a line's ends; left out, the pattern matches
                    # wherever the original does, so it can find the lines to check.
                    removed = True
                    emit("(?:)")
                    if skipping is None:
                        skipping = depth
                    opener = ""
                    skip = 4 if after in ("<=", "<!") else 3
                elif after[:1] == "(":
                    unsafe = True  # a conditional: its condition is read as a group next
                    skip = 2
                else:
                    # Atomic groups (they drop paths), branch resets.
                    unsafe = True
                    skip = 3 if after[:1] in (">", "|") else 1
            emit(opener)
            depth += 1
            stack.append([0, 0, 0 if source.startswith("(?:", i) else 2])
            i += skip if skip is not None else max(len(opener), 1)
            continue
        if c == ")":
            if depth:
                depth -= 1
                if skipping == depth:
                    skipping = None
                else:
                    emit(")")
            if len(stack) > 1:
                inner, _, node = stack.pop()
                item(max(inner, 1) + node)
            i += 1
            continue
        if c == "|":
            emit(c)
            stack[-1][1] = 0
            i += 1
            continue
        bounds: tuple[int, int | None] | None = None
        j = i + 1
        if c in "*+?":
            bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{":
            close = source.find("}", i + 1)
            body = source[i + 1 : close] if close >= 0 else ""
            counted = _COUNT.fullmatch(body) if close >= 0 else None
            if counted is not None and (counted.group(1) or counted.group(2)):
                low = int(counted.group(1) or 0)
                if counted.group(2) is None:
                    bounds = (low, low)
                else:
                    bounds = (low, int(counted.group(3)) if counted.group(3) else None)
                j = close + 1
            elif any(ch in body for ch in "<=") or body.strip() in ("e", "i", "d", "s"):
                unsafe = True  # a fuzzy-matching constraint such as {e<=1}
        if bounds is not None:
            repeat(*bounds)
            # A "?" after a quantifier makes it lazy and a "+" possessive: no repeat of their
            # own, but a possessive repeat is an atomic group around the repeat.
            if source.startswith("+", j):
                if not free:
                    unsafe = True  # possessive: drops paths
                item_steps = stack[-1]
                item_steps[0] += 2
                item_steps[1] += 2
                j += 1
            elif source.startswith("?", j):
                j += 1
            emit(source[i:j])
            i = j
            continue
        emit(c)
        item(1)
        i += 1
    while len(stack) > 1:
        inner, _, node = stack.pop()
        item(max(inner, 1) + node)
    # Leaving out a lookaround that holds a group would renumber the groups backreferences use.
    block = None if unsafe or (removed and backrefs) else "".join(out)
    expansion = stack[0][0] * (_CALL_COPIES if calls else 1)
    return _Shape(block, block is not None and not removed, expansion)


def search_mode(source: str) -> Literal["block", "prefilter", "line"]:
    """How :class:`BoundedPattern` searches the lines of a file for ``source``.

    ``block``: all lines joined by ``\\n`` in one search (multiline mode), in windows of
    whole lines. The pattern has no construct that looks beyond its own path through the
    text, so a block match that starts on a line and ends before its newline is that line's
    first match, and a line with a match always gives a block match on it or before it; a
    block match that runs across a newline is checked on its line alone. Lookaround, atomic
    groups and possessive quantifiers qualify when the pattern can never match a newline:
    then what they look at or keep never reaches past one.

    ``prefilter``: the pattern has lookaround and may match a newline. The block is searched
    for the pattern without its lookarounds, which matches wherever the pattern does, and
    each line found is checked with the pattern alone.

    ``line``: one search per line, for atomic groups and possessive quantifiers in a pattern
    that may match a newline (they drop paths), ``\\A``, ``\\Z``, ``\\G``, ``\\K``, ``\\X``,
    inline flags, verbs, conditionals, fuzzy constraints, and lookaround left out together
    with backreferences.
    """
    shape = _scan(source)
    if shape.block is None:
        return "line"
    return "block" if shape.exact else "prefilter"


class BoundedPattern:
    """A compiled pattern whose match calls together take at most ``timeout`` seconds of
    wall-clock time.

    One object serves one search (all its files), its calls made by one thread at a time;
    it is not meant to be shared between searches running at the same time. :meth:`cancel`
    (from any thread) or :meth:`close` ends it, and the matcher process it may have started.

    Parameters
    ----------
    source : str
        A Python (``regex`` ``VERSION0``) regular expression.
    case_sensitive : bool
        Match case exactly; otherwise ignore case.
    timeout : float
        Wall-clock seconds of matching for the whole search.
    line_limit : int
        Characters of each line that are matched.

    Raises
    ------
    PatternError
        The pattern is invalid, expands past :data:`MAX_PATTERN_EXPANSION` steps, or holds a
        comment or a flag that is refused (see :func:`_scan`).
    """

    def __init__(
        self,
        source: str,
        *,
        case_sensitive: bool = True,
        timeout: float = DEFAULT_MATCH_TIMEOUT,
        line_limit: int = MATCH_LINE_LIMIT,
    ) -> None:
        shape = _scan(source)
        if shape.refused is not None:
            raise PatternError(shape.refused)
        if shape.expansion > MAX_PATTERN_EXPANSION:
            raise PatternError(
                f"the pattern expands to about {shape.expansion:,} steps (nested counted repeats such as "
                f"(?:a{{1000}}){{1000}}); at most {MAX_PATTERN_EXPANSION:,} are allowed"
            )
        flags = regex.VERSION0 | (0 if case_sensitive else regex.IGNORECASE)
        try:
            self.line = regex.compile(source, flags)
        except RecursionError:
            raise PatternError("the pattern nests groups too deeply") from None
        except (OverflowError, ValueError) as exc:
            raise PatternError(str(exc)) from None
        self.block: regex.Pattern[str] | None = None
        # What a matcher process compiles: the line pattern, then the block pattern if any.
        self._sources = [(source, flags)]
        block = shape.block
        if block is not None:
            try:
                self.block = regex.compile(block, flags | regex.MULTILINE)
            except (PatternError, RecursionError, OverflowError, ValueError):
                shape = _Shape(None, False, shape.expansion)  # then line by line
            else:
                self._sources.append((block, flags | regex.MULTILINE))
        #: Whether a block match within one line is that line's answer (no lookaround left out).
        self.exact = shape.exact
        self.source = source
        self.timeout = timeout
        #: Wall-clock seconds spent in match calls so far.
        self.spent = 0.0
        self.line_limit = line_limit
        #: Lines longer than ``line_limit`` met so far (matched on their start only).
        self.long_lines = 0
        self._cancelled = threading.Event()
        # The matcher process, once a call needed more than MATCH_SLICE; created and killed
        # under the lock, so a cancel never misses one being started.
        self._lock = threading.Lock()
        self._matcher: Matcher | None = None
        self._in_process = False

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called (the search's caller gave up on it)."""
        return self._cancelled.is_set()

    @property
    def expired(self) -> bool:
        """Whether the budget is spent or the search was cancelled."""
        return self._cancelled.is_set() or self.spent >= self.timeout

    def cancel(self) -> None:
        """Make every later match call raise :class:`MatchTimeout`, and end the one under way:
        a search abandoned in its worker thread stops at once instead of running out its
        time. Any thread may call it."""
        with self._lock:
            self._cancelled.set()
            if self._matcher is not None:
                self._matcher.kill()

    def close(self) -> None:
        """End the search: :meth:`cancel`, and reap the matcher process (call it where no match
        call runs, e.g. once the search is done)."""
        self.cancel()
        if self._matcher is not None:
            self._matcher.close()

    def _search(
        self, compiled: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None
    ) -> tuple[int, int] | None:
        """The span of ``compiled``'s first match in ``text[pos:endpos]``, or None."""
        remaining = self.timeout - self.spent
        if remaining <= 0 or self._cancelled.is_set():
            raise MatchTimeout(self.source, self.timeout)
        started = time.monotonic()
        try:
            if self._matcher is None:
                # The common case, kept short: every match call of every grep comes here.
                # regex's timeout is CPU time of the process: in-process calls get a slice,
                # which even a busy machine turns into little wall-clock time.
                try:
                    found = compiled.search(
                        text, pos, endpos, concurrent=True,
                        timeout=remaining if self._in_process else min(remaining, MATCH_SLICE),
                    )  # fmt: skip
                    return None if found is None else found.span()
                except TimeoutError:
                    if self._in_process or self._cancelled.is_set() or time.monotonic() - started >= remaining:
                        raise MatchTimeout(self.source, self.timeout) from None
                if not self._start_matcher():
                    return self._in_process_search(compiled, text, pos, endpos, started + remaining)
            return self._matcher_search(compiled, text, pos, endpos, started + remaining)
        except MatchTimeout:
            self.spent = self.timeout  # spent, whatever the clock says: nothing more is tried
            raise
        finally:
            self.spent += time.monotonic() - started

    def _in_process_search(
        self, compiled: regex.Pattern[str], text: str, pos: int, endpos: int | None, deadline: float
    ) -> tuple[int, int] | None:
        """A match call in this process for what is left until ``deadline`` (counted by regex
        in CPU time: no matcher process can be had)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise MatchTimeout(self.source, self.timeout)
        try:
            found = compiled.search(text, pos, endpos, concurrent=True, timeout=remaining)
        except TimeoutError:
            raise MatchTimeout(self.source, self.timeout) from None
        return None if found is None else found.span()

    def _matcher_search(
        self, compiled: regex.Pattern[str], text: str, pos: int, endpos: int | None, deadline: float
    ) -> tuple[int, int] | None:
        """A match call in the matcher process, killed at ``deadline`` (on
        :func:`time.monotonic`); in this process from now on if it died."""
        assert self._matcher is not None
        try:
            return self._matcher.search(0 if compiled is self.line else 1, text, pos, endpos, deadline)
        except TimeoutError:
            raise MatchTimeout(self.source, self.timeout) from None
        except MatcherDied as exc:
            _log.warning("grep: %s; matching in this process, where a busy machine may stretch the deadline", exc)
            self._matcher = None
            self._in_process = True
            return self._in_process_search(compiled, text, pos, endpos, deadline)

    def _start_matcher(self) -> bool:
        """Start the matcher process; False (and matching in this process from now on, with
        the deadline counted in CPU time) where none can be started."""
        with self._lock:
            if self._cancelled.is_set():
                raise MatchTimeout(self.source, self.timeout)
            reason = "no interpreter to run, or no poll()"
            if matcher_supported():
                try:
                    self._matcher = Matcher(self._sources)
                except OSError as exc:
                    reason = str(exc)
                else:
                    return True
            _log.warning("grep: no matcher process (%s); a busy machine may stretch the deadline", reason)
            self._in_process = True
            return False

    def search_line(self, line: str) -> int | None:
        """The 0-based column of the first match in ``line`` (its first ``line_limit``
        characters), or None.

        Raises
        ------
        MatchTimeout
            The budget is spent.
        """
        if len(line) > self.line_limit:
            line = line[: self.line_limit]
        found = self._search(self.line, line)
        return None if found is None else found[0]

    def search_block(self, text: str, hits: list[tuple[int, int]], *, limit: int | None = None) -> None:
        """Append ``(line index, 0-based column)`` for each line of ``text`` (lines joined by
        ``\\n``; a trailing ``\\n`` makes a last, empty line) whose first ``line_limit``
        characters match, in order, stopping after ``limit`` of them.

        ``hits`` is filled as lines are found, so it holds what was found when
        :class:`MatchTimeout` interrupts.

        Raises
        ------
        MatchTimeout
            The budget is spent.
        """
        if limit is not None and limit <= 0:
            return
        lines: list[str] | None = None
        if len(text) > self.line_limit:
            lines = text.split("\n")
            if max(map(len, lines)) > self.line_limit:
                cap = self.line_limit
                self.long_lines += sum(1 for line in lines if len(line) > cap)
                lines = [line[:cap] if len(line) > cap else line for line in lines]
                text = "\n".join(lines)
        found_here = 0
        if self.block is None:
            for index, line in enumerate(lines if lines is not None else text.split("\n")):
                column = self.search_line(line)
                if column is not None:
                    hits.append((index, column))
                    found_here += 1
                    if limit is not None and found_here >= limit:
                        return
            return
        end = len(text)
        # ``pos`` is always the start of a line; ``index`` counts the newlines before ``counted``.
        pos = index = counted = 0
        while True:
            # Search a window of whole lines: a match that starts early and runs on across
            # many lines (``a[^z]*b``) then costs at most a window, not the rest of the text.
            stop = end if end - pos <= _WINDOW else text.find("\n", pos + _WINDOW)
            if stop < 0:
                stop = end
            found = self._search(self.block, text, pos, stop)
            if found is None:
                if stop >= end:
                    return
                pos = stop + 1
                continue
            start, found_end = found
            index += text.count("\n", counted, start)
            counted = start
            newline = text.rfind("\n", pos, start)
            line_start = pos if newline < 0 else newline + 1
            line_end = text.find("\n", start)
            if line_end < 0:
                line_end = end
            if self.exact and found_end <= line_end:
                column = start - line_start
            else:
                # The block's match runs across the newline, or it is the pattern without
                # its lookarounds: the line alone says.
                column = self.search_line(text[line_start:line_end])
            if column is not None:
                hits.append((index, column))
                found_here += 1
                if limit is not None and found_here >= limit:
                    return
            if line_end >= end:
                return
            pos = line_end + 1
            index += text.count("\n", counted, pos)
            counted = pos


class LineChunker:
    """Cut a stream of bytes into text of whole lines, with memory bounded by the line limit.

    :meth:`feed` returns the decoded lines completed so far (joined by ``\\n``, without the
    last newline) and keeps the unfinished line; :meth:`finish` returns that last line.
    Bytes of a line beyond ``4 * line_limit + 4`` (more than ``line_limit`` characters in any
    encoding) are dropped, so one giant line costs at most that much memory. Invalid UTF-8
    becomes U+FFFD, as a whole-file decode would make it (``\\n`` is never inside a
    multi-byte sequence).
    """

    def __init__(self, line_limit: int = MATCH_LINE_LIMIT) -> None:
        self._keep = 4 * line_limit + 4
        self._carry = bytearray()

    def feed(self, data: bytes) -> str | None:
        """The lines ``data`` completes, or None if it completes none."""
        cut = data.rfind(b"\n")
        if cut < 0:
            self._append(data)
            return None
        first = data.find(b"\n")
        self._append(data[:first])
        head = bytes(self._carry) + data[first:cut]
        self._carry = bytearray()
        self._append(data[cut + 1 :])
        return head.decode("utf-8", errors="replace")

    def finish(self) -> str:
        """The last line (empty when the data ended with a newline)."""
        tail = bytes(self._carry)
        self._carry = bytearray()
        return tail.decode("utf-8", errors="replace")

    def _append(self, data: bytes) -> None:
        room = self._keep - len(self._carry)
        if room > 0:
            self._carry += data[:room]


def compile_pattern(pattern: str, *, case_sensitive: bool, timeout: float | None = None) -> BoundedPattern:
    """Compile a Python regular expression for one search, ignoring case unless
    ``case_sensitive``; its matching may take ``timeout`` seconds in all (by default
    :data:`DEFAULT_MATCH_TIMEOUT`).

    Raises
    ------
    PatternError
        The pattern is invalid or too large once expanded.
    """
    seconds = DEFAULT_MATCH_TIMEOUT if timeout is None else timeout
    return BoundedPattern(pattern, case_sensitive=case_sensitive, timeout=seconds)


def grep_lines(
    path: str,
    data: bytes,
    regex: BoundedPattern,
    *,
    max_count: int | None,
    context_lines: int,
    budget: int | None,
) -> GrepFileResult | None:
    """Search one file's bytes (decoded as UTF-8, bad bytes replaced) line by line.

    The first match on a line counts; ``max_count`` caps matches in this file and ``budget``
    what is left of the global cap. Only the first :data:`MATCH_LINE_LIMIT` characters of a
    line are matched. Returns None when nothing matched.

    Raises
    ------
    MatchTimeout
        The pattern's time budget ran out (the message names ``path``).
    """
    text = data.decode("utf-8", errors="replace")
    caps = [x for x in (max_count, budget) if x is not None]
    # At least one match is reported, as the line-by-line loop did.
    limit = max(min(caps), 1) if caps else None
    hits: list[tuple[int, int]] = []
    try:
        regex.search_block(text, hits, limit=limit)
    except MatchTimeout as exc:
        raise exc.at(path) from None
    if not hits:
        return None
    lines = text.split("\n")
    matches: list[GrepMatch] = []
    for index, column in hits:
        matches.append(
            GrepMatch(
                line=index + 1,
                column=column,
                text=lines[index],
                before=tuple(lines[max(0, index - context_lines) : index]) if context_lines else (),
                after=tuple(lines[index + 1 : index + 1 + context_lines]) if context_lines else (),
            )
        )
    return GrepFileResult(path=path, matches=tuple(matches))

