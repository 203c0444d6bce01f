"""Pure helpers of the agent tools: output limits, line ranges, literal replacement, globs."""

from __future__ import annotations

import pytest

from agentvfs.errors import StringNotFoundError, StringNotUniqueError
from agentvfs.tools._lines import (
    MAX_REPORTED_OCCURRENCES,
    Replacement,
    extract_lines,
    format_with_line_numbers,
    line_numbers,
    nth_newline,
    replace_string,
)
from agentvfs.tools._output import (
    apply_tail,
    apply_token_limit,
    apply_token_limit_sandwich,
    count_tokens,
    output_char_budget,
)
from agentvfs.vfs import create_glob_matcher, extract_glob_base, is_glob_pattern


def seq(a: int, b: int) -> str:
    return "".join(f"{i}\n" for i in range(a, b + 1))


def test_apply_tail() -> None:
    assert apply_tail(seq(1, 10), 3) == "[showing last 3 of 10 lines]\n8\n9\n10\n"
    assert apply_tail(seq(1, 10), -2.7) == "[showing last 2 of 10 lines]\n9\n10\n"
    assert apply_tail(seq(1, 10), 0) == seq(1, 10)
    assert apply_tail(seq(1, 3), 5) == seq(1, 3)
    assert apply_tail("a\nb\nc", 2) == "[showing last 2 of 3 lines]\nb\nc"
    assert apply_tail(seq(1, 250)).startswith("[showing last 200 of 250 lines]\n51\n")


def test_token_limits() -> None:
    text = seq(1, 300)
    total = count_tokens(text)
    assert apply_token_limit(text, total) == text
    head = apply_token_limit(text, 50, "end")
    assert head.endswith(f"\n[output truncated: showing first ~50 of ~{total} tokens]")
    assert head.startswith("1\n2\n3\n")
    tail = apply_token_limit(text, 50, "start")
    assert tail.startswith(f"[output truncated: showing last ~50 of ~{total} tokens]\n")
    assert tail.endswith("299\n300\n")
    sandwich = apply_token_limit_sandwich(text, 50)
    assert sandwich.startswith("1\n2\n3")
    assert f"\n[...output truncated — showing first ~5 + last ~45 of ~{total} tokens...]\n" in sandwich
    assert sandwich.endswith("300\n")
    assert apply_token_limit_sandwich("short", 50) == "short"


def test_extract_and_number_lines() -> None:
    five = "Line 1\nLine 2\nLine 3\nLine 4\nLine 5"
    r = extract_lines(five, 2, 2)
    assert (r.lines, r.start, r.end, r.total) == (["Line 2", "Line 3"], 2, 3, 5)
    r = extract_lines(five, 10)
    assert (r.lines, r.start, r.end, r.total) == ([], 0, 0, 5)
    assert extract_lines("").total == 1
    assert format_with_line_numbers(["Hello World", "second line", ""], 1) == "     1→Hello World\n     2→second line\n     3→"
    assert format_with_line_numbers(["x"], 999999).startswith(" 999999→")
    assert format_with_line_numbers(["x"], 1000000) == " 1000000→x"  # width = digits + 1


def test_replace_string() -> None:
    text = "foo\nbar\nfoo\nbaz $x\n"
    with pytest.raises(StringNotFoundError, match="The specified text was not found"):
        replace_string(text, "qux", "y")
    with pytest.raises(StringNotFoundError):
        replace_string(text, "", "y")
    with pytest.raises(StringNotUniqueError, match=r"The specified text appears 2 times\."):
        replace_string(text, "foo", "F")
    done = replace_string(text, "foo", "$& $$ $1", replace_all=True)
    assert done.text == "$& $$ $1\nbar\n$& $$ $1\nbaz $x\n" and done.positions == [0, 8] and done.count == 2
    assert replace_string("aaa", "aa", "b", replace_all=True).text == "ba"  # non-overlapping
    assert replace_string(text, "bar", "B") == Replacement("foo\nB\nfoo\nbaz $x\n", [4], 1)
    many = replace_string("x" * (MAX_REPORTED_OCCURRENCES + 5), "x", "y", replace_all=True)
    assert many.count == MAX_REPORTED_OCCURRENCES + 5 and len(many.positions) == MAX_REPORTED_OCCURRENCES
    assert line_numbers("a\nb\n\nc", [0, 2, 3, 5]) == [1, 2, 2, 4]


def test_nth_newline() -> None:
    text = "a\nbb\n\nccc\n"
    assert [nth_newline(text, k) for k in range(1, 6)] == [1, 4, 5, 9, -1]
    assert nth_newline(text, 2, 3) == 5
    big = "x\n" * 200_000  # longer than one counting slice
    assert nth_newline(big, 150_000) == 2 * 150_000 - 1 and nth_newline(big, 200_001) == -1


def test_token_limit_bounds() -> None:
    assert output_char_budget(2000) == 2000 * 128 + 4096
    exact = "".join(f"{i} apples\n" for i in range(100_000))
    limited = apply_token_limit(exact, 500)  # tokenized only as far as the output reaches
    assert limited.startswith("0 apples\n1 apples\n") and limited.endswith(" tokens]")
    estimated = int(limited.rsplit("~", 1)[1].split()[0])
    assert abs(estimated - count_tokens(exact)) < count_tokens(exact) * 0.1
    sandwich = apply_token_limit_sandwich(exact * 3, 100)
    assert sandwich.startswith("0 apples") and sandwich.endswith("99999 apples\n")
    assert "[...output truncated — showing first ~10 + last ~90 of ~" in sandwich


def test_globs() -> None:
    assert [is_glob_pattern(p) for p in ("a/*.ts", "a/b.ts", "{a,b}", "x[0]")] == [True, False, True, True]
    cases = {"docs/**/*.md": "docs", "**/*.md": ".", "src/*.ts": "src", "/docs/**": "/docs", "/*.md": ".", "plain/path": "plain/path"}
    for pattern, base in cases.items():
        assert extract_glob_base(pattern) == base, pattern
    ts = create_glob_matcher("*.ts")
    assert ts("a.ts") and not ts("src/a.ts") and ts("./a.ts")
    deep = create_glob_matcher("**/*.ts")
    assert deep("a.ts") and deep("src/util/a.ts") and not deep("src/.hidden/a.ts")
    assert create_glob_matcher("**/*.ts", dot=True)("src/.hidden/a.ts")
    braces = create_glob_matcher(["docs/**/*.{md,txt}"])
    assert braces("docs/a/b.md") and braces("/docs/x.txt") and not braces("docs/x.rst")
    assert create_glob_matcher("**/content")("a/b/content")
