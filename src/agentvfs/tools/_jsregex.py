"""JavaScript regular expressions (``new RegExp(source, "g" | "gi")``) on the ``regex`` package.

The grep tool takes patterns written for JavaScript's ``RegExp`` without the ``u`` flag (the
web-compatible grammar of ECMAScript Annex B). :func:`translate` rewrites such a pattern into
one that the ``regex`` package (``VERSION0``, no flags) runs with the same matches, and refuses
what JavaScript refuses, as :class:`regex.error`.

Without the ``u`` flag JavaScript matches UTF-16 code units: ``.`` takes one half of a
surrogate pair, and a column counts an emoji as two. Text is therefore searched as units
(:func:`to_units` writes each astral character as its two surrogates, :func:`from_units`
joins them again), and the pattern is read as units too.

What the translation settles:

* ``\\d``, ``\\w``, ``\\b`` are ASCII; ``\\s`` is JavaScript's white space and line terminators;
  ``.`` excludes ``\\n``, ``\\r``, U+2028 and U+2029; ``[^]`` is any unit and ``[]`` none;
* escapes: ``\\cX``, ``\\xHH``, ``\\uHHHH``, ``\\0``, legacy octal, ``\\b`` in a class
  (backspace), identity escapes (``\\A``, ``\\Z``, ``\\p`` are the letters themselves);
* a backreference to a group that has not matched matches the empty string; ``\\1`` to
  ``\\9...`` beyond the number of groups is octal (or the digit itself);
* named groups and ``\\k<name>`` (``\\k`` is a plain ``k`` in a pattern without named groups);
* ``{`` that opens no quantifier is literal; lookaheads may be quantified, lookbehinds not;
* ignoring case compares ``toUpperCase`` of single units, keeping a unit whose upper case is
  several units, or ASCII from non-ASCII: ``ſ`` does not match ``s`` nor the Kelvin sign ``k``.
  Literals become sets of their case variants and sets are closed over case, so the compiled
  pattern needs no flag (backreferences alone compare under ``regex``'s own case folding).

Left as ``regex`` does it: captures inside a repeated group are not reset at each iteration,
and the case folding of backreferences is ``regex``'s.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass, field

from regex import error as PatternError

from ..vfs import to_units

__all__ = ["DOT", "PatternError", "canonical_unit", "translate"]

#: The largest code unit; text searched is made of units (see :func:`to_units`).
_MAX_UNIT = 0xFFFF
_MAX_CODE_POINT = 0x10FFFF
#: A repeat count JavaScript takes as unbounded (it clamps larger ones).
_UNBOUNDED = 2**31 - 1

_QUANTIFIER = re.compile(r"\{([0-9]+)(,([0-9]*))?\}")
_HEX = frozenset("0123456789abcdefABCDEF")
_OCTAL = "01234567"

Ranges = list[tuple[int, int]]

_DIGIT: Ranges = [(0x30, 0x39)]
_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
#: JavaScript's WhiteSpace and LineTerminator (``\s``).
_SPACE: Ranges = [
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
]  # fmt: skip
#: What ``.`` becomes: JavaScript's dot matches any unit but a line terminator.
DOT = "[^\\n\\r\\u2028\\u2029]"
_LINE_TERMINATORS: Ranges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]
_CONTROL_ESCAPES = {"f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B}

# \b and \B over ASCII word characters (regex's own are Unicode-aware).
_W = "[0-9A-Z_a-z]"
_WORD_BOUNDARY = f"(?:(?<={_W})(?!{_W})|(?<!{_W})(?={_W}))"
_NOT_WORD_BOUNDARY = f"(?:(?<={_W})(?={_W})|(?<!{_W})(?!{_W}))"


# -- sets of code units ----------------------------------------------------------------------------


def _normalise(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            if high > out[-1][1]:
                out[-1] = (out[-1][0], high)
        else:
            out.append((low, high))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out: Ranges = []
    start = 0
    for low, high in _normalise(ranges):
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= _MAX_CODE_POINT:
        out.append((start, _MAX_CODE_POINT))
    return out


def canonical_unit(code: int) -> int:
    """The unit ``code`` is compared as when case is ignored (``i`` without ``u``): its upper
    case when that is one unit, except that a non-ASCII unit never maps to ASCII (the Kelvin
    sign is not ``k``). Two units match ignoring case when their canonical units are equal."""
    upper = chr(code).upper()
    return ord(upper) if len(upper) == 1 and not (code >= 128 and ord(upper) < 128) else code


@functools.cache
def _case_table() -> tuple[list[int], dict[int, tuple[int, ...]]]:
    """The units that have case variants (sorted), and each one's variants (itself included)."""
    classes: dict[int, list[int]] = {}
    for code in range(_MAX_UNIT + 1):
        classes.setdefault(canonical_unit(code), []).append(code)
    variants: dict[int, tuple[int, ...]] = {}
    for members in classes.values():
        if len(members) > 1:
            for code in members:
                variants[code] = tuple(members)
    return sorted(variants), variants


def _close_over_case(ranges: Ranges) -> Ranges:
    """``ranges`` and every unit that matches one of them ignoring case."""
    cased, variants = _case_table()
    extra: Ranges = []
    for low, high in ranges:
        for index in range(bisect.bisect_left(cased, low), bisect.bisect_right(cased, high)):
            extra.extend((code, code) for code in variants[cased[index]])
    return _normalise(ranges + extra)


def _unit(code: int) -> str:
    if code < 128 and (chr(code).isalnum() or code == 0x5F):
        return chr(code)
    return f"\\u{code:04x}" if code <= _MAX_UNIT else f"\\U{code:08x}"


def _set_text(ranges: Ranges) -> str:
    """A ``regex`` set matching exactly ``ranges`` (empty: a pattern that never matches)."""
    ranges = _normalise(ranges)
    if not ranges:
        return "(?!)"
    inverse = _complement(ranges)
    negate = len(inverse) < len(ranges)
    parts = []
    for low, high in inverse if negate else ranges:
        parts.append(_unit(low) if low == high else f"{_unit(low)}-{_unit(high)}")
    if not parts:
        return "[\\u0000-\\U0010ffff]"
    return ("[^" if negate else "[") + "".join(parts) + "]"


# -- the parser ---------------------------------------------------------------------------------------


@dataclass
class _Frame:
    """An open group: what it starts with, its alternatives so far and its current items."""

    opening: str
    #: How the finished group behaves before a quantifier (see :meth:`_Translator.quantify`).
    kind: str
    start: int
    alternatives: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    #: The kind of the last item (None: there is none, or it is quantified already).
    last: str | None = None


@dataclass(frozen=True, slots=True)
class _Groups:
    """What a pattern's capturing groups are: their number and their names in order."""

    count: int
    names: dict[str, int]


def _group_name(source: str, i: int) -> tuple[str, int] | None:
    """The group name at ``source[i]`` (after ``<``) up to ``>``, and the index after ``>``;
    None when it is no valid name."""
    end = source.find(">", i)
    if end <= i:
        return None
    name = source[i:end]
    # \uHHHH escapes may spell a name's characters.
    name = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), name)
    head, tail = name[0], name[1:]
    if not (head in "$_" or head.isidentifier()):
        return None
    if not all(c in "$\u200c\u200d" or ("a" + c).isidentifier() for c in tail):
        return None
    return name, end + 1


def _scan_groups(source: str) -> _Groups:
    """Count the capturing groups and collect their names (a first pass: a ``\\1`` or a
    ``\\k<name>`` may come before its group)."""
    count = 0
    names: dict[str, int] = {}
    i, n = 0, len(source)
    in_class = False
    while i < n:
        c = source[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            if not source.startswith("?", i + 1):
                count += 1
            elif source.startswith("?<", i + 1) and source[i + 3 : i + 4] not in ("=", "!"):
                count += 1
                found = _group_name(source, i + 3)
                if found is not None:
                    names.setdefault(found[0], count)
        i += 1
    return _Groups(count, names)


class _Translator:
    """One pass over a pattern (as code units), writing the ``regex`` pattern."""

    def __init__(self, source: str, ignore_case: bool) -> None:
        self.source = source
        self.ignore_case = ignore_case
        self.groups = _scan_groups(source)
        self.seen_names: set[str] = set()

    def fail(self, message: str, pos: int) -> PatternError:
        return PatternError(message, self.source, pos)

    def run(self) -> str:
        src = self.source
        n = len(src)
        stack = [_Frame("", "root", 0)]
        i = 0
        while i < n:
            top = stack[-1]
            c = src[i]
            if c == "|":
                top.alternatives.append("".join(top.items))
                top.items, top.last = [], None
                i += 1
            elif c == "(":
                frame, i = self.open_group(i)
                stack.append(frame)
            elif c == ")":
                if len(stack) == 1:
                    raise self.fail("unmatched ')'", i)
                stack.pop()
                text = top.opening + "|".join([*top.alternatives, "".join(top.items)]) + ")"
                stack[-1].items.append(text)
                stack[-1].last = top.kind
                i += 1
            elif c in "*+?" or (c == "{" and _QUANTIFIER.match(src, i)):
                i = self.quantify(top, i)
            elif c in "^$":
                top.items.append(c)
                top.last = "assertion"
                i += 1
            elif c == ".":
                top.items.append(DOT)
                top.last = "atom"
                i += 1
            elif c == "[":
                ranges, i = self.char_class(i)
                top.items.append(_set_text(self.cased(ranges)))
                top.last = "atom"
            elif c == "\\":
                text, kind, i = self.atom_escape(i)
                top.items.append(text)
                top.last = kind
            else:
                top.items.append(self.literal(ord(c)))
                top.last = "atom"
                i += 1
        if len(stack) > 1:
            raise self.fail("unterminated group", stack[-1].start)
        root = stack[0]
        return "|".join([*root.alternatives, "".join(root.items)])

    def open_group(self, i: int) -> tuple[_Frame, int]:
        src = self.source
        if not src.startswith("?", i + 1):
            return _Frame("(", "atom", i), i + 1
        for opening, kind in (("(?:", "atom"), ("(?=", "lookahead"), ("(?!", "lookahead")):
            if src.startswith(opening, i):
                return _Frame(opening, kind, i), i + 3
        for opening in ("(?<=", "(?<!"):
            if src.startswith(opening, i):
                return _Frame(opening, "lookbehind", i), i + 4
        if src.startswith("(?<", i):
            found = _group_name(src, i + 3)
            if found is None:
                raise self.fail("invalid capture group name", i + 3)
            name, after = found
            if name in self.seen_names:
                raise self.fail("duplicate capture group name", i + 3)
            self.seen_names.add(name)
            return _Frame("(", "atom", i), after
        raise self.fail("invalid group", i)

    def quantify(self, top: _Frame, i: int) -> int:
        src = self.source
        c = src[i]
        if c == "{":
            found = _QUANTIFIER.match(src, i)
            assert found is not None
            low = int(found.group(1))
            high: int | None = low if found.group(2) is None else (int(found.group(3)) if found.group(3) else None)
            if high is not None and high < low:
                raise self.fail("numbers out of order in {} quantifier", i)
            low = min(low, _UNBOUNDED)
            if high is not None and high >= _UNBOUNDED:
                high = None
            text = f"{{{low}}}" if high == low else f"{{{low},{'' if high is None else high}}}"
            end = found.end()
        else:
            text, end = c, i + 1
        if top.last == "lookbehind":
            raise self.fail("invalid quantifier", i)
        if top.last not in ("atom", "lookahead"):
            raise self.fail("nothing to repeat", i)
        if src.startswith("?", end):
            text += "?"
            end += 1
        if top.last == "lookahead":
            # regex repeats no lookaround: a group holds it.
            top.items[-1] = f"(?:{top.items[-1]})"
        top.items[-1] += text
        top.last = None
        return end

    def literal(self, code: int) -> str:
        if self.ignore_case:
            return _set_text(self.cased([(code, code)])) if code in _case_table()[1] else _unit(code)
        return _unit(code)

    def cased(self, ranges: Ranges) -> Ranges:
        return _close_over_case(ranges) if self.ignore_case else ranges

    def atom_escape(self, i: int) -> tuple[str, str, int]:
        """The escape at ``source[i]`` (a backslash) outside a set: its text, its kind and the
        index after it."""
        src = self.source
        if i + 1 >= len(src):
            raise self.fail("\\ at end of pattern", i)
        c = src[i + 1]
        if c == "b":
            return _WORD_BOUNDARY, "assertion", i + 2
        if c == "B":
            return _NOT_WORD_BOUNDARY, "assertion", i + 2
        if c in "123456789":
            digits = re.match(r"[0-9]+", src[i + 1 :])
            assert digits is not None
            number = int(digits.group())
            if number <= self.groups.count:
                return self.backreference(number), "atom", i + 1 + len(digits.group())
        if c == "k" and self.groups.names:
            if not src.startswith("<", i + 2):
                raise self.fail("invalid named reference", i)
            found = _group_name(src, i + 3)
            if found is None or found[0] not in self.groups.names:
                raise self.fail("invalid named capture referenced", i)
            return self.backreference(self.groups.names[found[0]]), "atom", found[1]
        classes = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
        if c.lower() in classes:
            ranges = classes[c.lower()]
            return _set_text(self.cased(_complement(ranges) if c.isupper() else ranges)), "atom", i + 2
        code, end = self.character_escape(i, in_class=False)
        return self.literal(code), "atom", end

    def backreference(self, number: int) -> str:
        # A group that has not matched (yet) matches the empty string in JavaScript.
        ref = f"(?i:\\g<{number}>)" if self.ignore_case else f"\\g<{number}>"
        return f"(?({number}){ref}|)"

    def character_escape(self, i: int, *, in_class: bool) -> tuple[int, int]:
        """The unit an escape of one character stands for, and the index after it.

        ``\\c`` not followed by a letter (nor, in a set, a digit or ``_``) is a backslash of
        its own: the index after it is then that of the ``c``.
        """
        src = self.source
        c = src[i + 1]
        if c in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[c], i + 2
        if c == "c":
            letter = src[i + 2 : i + 3]
            if letter.isascii() and (letter.isalpha() or (in_class and (letter.isdigit() or letter == "_"))):
                return ord(letter) % 32, i + 3
            return ord("\\"), i + 1
        if c == "x":
            digits = src[i + 2 : i + 4]
            if len(digits) == 2 and set(digits) <= _HEX:
                return int(digits, 16), i + 4
            return ord("x"), i + 2
        if c == "u":
            digits = src[i + 2 : i + 6]
            if len(digits) == 4 and set(digits) <= _HEX:
                return int(digits, 16), i + 6
            return ord("u"), i + 2
        if c in _OCTAL:
            # Legacy octal: up to three digits, at most \377.
            limit = 3 if c in "0123" else 2
            end = i + 2
            while end < i + 1 + limit and src[end : end + 1] in tuple(_OCTAL):
                end += 1
            return int(src[i + 1 : end], 8), end
        return ord(c), i + 2

    def char_class(self, i: int) -> tuple[Ranges, int]:
        """The set opening at ``source[i]`` (``[``), and the index after it."""
        src = self.source
        n = len(src)
        j = i + 1
        negate = src.startswith("^", j)
        if negate:
            j += 1
        ranges: Ranges = []
        while True:
            if j >= n:
                raise self.fail("unterminated character class", i)
            if src[j] == "]":
                j += 1
                break
            low, j = self.class_atom(j)
            if src.startswith("-", j) and j + 1 < n and src[j + 1] != "]":
                high, after = self.class_atom(j + 1)
                if isinstance(low, int) and isinstance(high, int):
                    if low > high:
                        raise self.fail("range out of order in character class", j)
                    ranges.append((low, high))
                    j = after
                    continue
                # A class escape at either end: the "-" is a member of its own.
                for atom in (low, ord("-"), high):
                    ranges.extend([(atom, atom)] if isinstance(atom, int) else atom)
                j = after
                continue
            ranges.extend([(low, low)] if isinstance(low, int) else low)
        if negate:
            # Case is closed over before the complement: [^a] ignoring case excludes "A".
            return _complement(self.cased(ranges)), j
        return ranges, j

    def class_atom(self, j: int) -> tuple[int | Ranges, int]:
        """A member of a set at ``source[j]``: a unit, or the ranges of a class escape."""
        src = self.source
        if src[j] != "\\":
            return ord(src[j]), j + 1
        if j + 1 >= len(src):
            raise self.fail("\\ at end of pattern", j)
        c = src[j + 1]
        if c == "b":
            return 0x08, j + 2
        classes = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
        if c.lower() in classes:
            ranges = classes[c.lower()]
            return (_complement(ranges) if c.isupper() else list(ranges)), j + 2
        if c in "89":
            return ord(c), j + 2
        if c == "k" and self.groups.names:
            raise self.fail("invalid escape", j)
        return self.character_escape(j, in_class=True)


def translate(source: str, *, ignore_case: bool = False) -> str:
    """The ``regex`` (``VERSION0``, no flags) pattern matching as ``new RegExp(source, "g")``
    does, or ``"gi"`` with ``ignore_case``, on text made of code units (:func:`to_units`).

    Raises
    ------
    regex.error
        JavaScript refuses the pattern (the message says why and where).
    """
    units = to_units(source)
    return _Translator(units, ignore_case).run()
