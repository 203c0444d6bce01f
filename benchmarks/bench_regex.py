"""Regex engines for grep: ``regex`` (``timeout=``, ``concurrent=True``) against RE2
(``google-re2``), with ``re`` (what grep used before) as the baseline, in one interleaved run.

Three criteria:

1. **Correct on the patterns agents send**: JavaScript-syntax patterns, translated as the grep
   tool translates them, run line by line over part of the corpus. Each engine's first-match
   column per line is compared with ``re``'s (the tool's results until now) and, when Node.js
   is installed, with JavaScript's ``RegExp`` (the syntax the tool advertises).
2. **Speed on an ordinary grep**: every pattern over every file of a corpus of a few thousand
   source files (by default Python files of the installed packages), engines interleaved in
   each round so they see the same machine state; the median of the rounds.
3. **Worst case on regex bombs**: seconds until an answer or the deadline, for one line and
   for a block of lines, and how often an event loop ticked (``anyio.sleep(0.01)``) while a
   worker thread matched.

Engines: ``re`` per line; ``regex`` per line (each call with ``timeout`` and
``concurrent=True``); ``agentvfs`` (``BoundedPattern.search_block``: ``regex``, a file's lines
searched as one block where that gives the same answer); RE2 per line and as a block (the same
block method), falling back to ``agentvfs`` for patterns RE2 refuses (backreferences,
lookaround).

Usage: ``python benchmarks/bench_regex.py [--files 3000] [--rounds 3] [--root DIR]
[--deadline 1.0] [--re-cap 10]``. RE2 rows need ``pip install google-re2`` (not a dependency
of agentvfs); without it they are left out.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata as metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import regex

from agentvfs.errors import MatchTimeout
from agentvfs.tools._jsregex import translate as translate_js_regex
from agentvfs.vfs import BoundedPattern
from agentvfs.vfs._grep import search_mode

try:
    import re2  # type: ignore[import-not-found]
except ImportError:  # measured only where installed
    re2 = None

#: (name, JavaScript source, case-sensitive): what agents grep for in code.
PATTERNS: list[tuple[str, str, bool]] = [
    ("literal alternation", r"TODO|FIXME", True),
    ("definition", r"def \w+\(", True),
    ("anchored import", r"^\s*import (os|sys)\b", True),
    ("class line", r"class [A-Z]\w*\(.*\):$", True),
    ("attribute assignment", r"self\.\w+ = ", True),
    ("raise", r"raise \w+Error\(", True),
    ("URL", r"https?://[^\s\"']+", True),
    ("date", r"\d{4}-\d{2}-\d{2}", True),
    ("ignore case", r"deprecated", False),
    ("trailing space", r"\s+$", True),
    ("non-ASCII", r"[^\x00-\x7F]", True),
    ("async def", r"async\s+def\s+\w+", True),
    ("lookbehind", r"(?<=def )_\w+", True),
    ("negative lookahead", r"^import (?!typing)\w+", True),
    ("backreference", r"\b(\w+) \1\b", True),
    ("named group", r"(?<key>\w+)=\k<key>", True),
]

#: (name, pattern, subject line): catastrophic backtracking, classic forms.
BOMBS: list[tuple[str, str, str]] = [
    ("(a+)+$ (the reported one)", r"(a+)+$", "a" * 40 + "!"),
    ("(a|a)+$", r"(a|a)+$", "a" * 40 + "!"),
    ("(a|aa)+$", r"(a|aa)+$", "a" * 60 + "!"),
    ("^(a|a?)+$", r"^(a|a?)+$", "a" * 40 + "!"),
    ("(x+x+)+y", r"(x+x+)+y", "x" * 40),
    ("^(\\w+\\s?)*$", r"^(\w+\s?)*$", "a" * 40 + "!"),
    ("email", r"^([a-zA-Z0-9])(([\-.]|[_]+)?([a-zA-Z0-9]+))*(@){1}[a-z0-9]+[.]{1}(([a-z]{2,3})|([a-z]{2,3}[.]{1}[a-z]{2,3}))$", "a" * 40 + "!"),
    ("(.*a){12}", r"(.*a){12}", "a" * 60 + "b"),
    ("(\\d+)*x", r"(\d+)*x", "1" * 40),
]

#: Lines with non-ASCII letters, digits and spaces, added to the correctness corpus.
UNICODE_LINES = [
    "def naïve(x):", "    self.café = 1", "class Größe(Base):", "raise ÜberError('x')",
    "date = '２０２４-０１-３１'", "ends with a no-break space\u00a0", "ends with an em space\u2003",
    "DEPRECATED İstanbul", "import ünicode", "déjà déjà vu", "clé=clé", "x = 'TODO: ü'",
]


def corpus(root: str | None, count: int) -> list[str]:
    """``count`` files spread over the tree (every k-th in sorted order), as text."""
    base = root or sysconfig.get_paths()["purelib"]
    files = sorted(glob.glob(os.path.join(base, "**", "*.py"), recursive=True))
    step = max(1, len(files) // count)
    out: list[str] = []
    for path in files[::step][:count]:
        with open(path, "rb") as f:
            out.append(f.read().decode("utf-8", errors="replace"))
    return out


Searcher = Callable[[str], list[tuple[int, int]]]


def per_line(search: Callable[[str], Any]) -> Searcher:
    def run(text: str) -> list[tuple[int, int]]:
        out = []
        for index, line in enumerate(text.split("\n")):
            found = search(line)
            if found is not None:
                out.append((index, found.start()))
        return out

    return run


def re2_block(line_search: Callable[[str], Any], block_search: Callable[[bytes, int, int], Any]) -> Searcher:
    """The agentvfs block method with RE2: windows of whole lines of the UTF-8 text (encoded
    once: the wrapper would encode a str again on every call), a match crossing a newline
    checked on its line alone, byte offsets turned back into characters."""

    def run(text: str) -> list[tuple[int, int]]:
        data = text.encode("utf-8", errors="surrogatepass")
        out: list[tuple[int, int]] = []
        end = len(data)
        pos = index = counted = 0
        while True:
            stop = end if end - pos <= 16384 else data.find(b"\n", pos + 16384)
            stop = end if stop < 0 else stop
            found = block_search(data, pos, stop)
            if found is None:
                if stop >= end:
                    return out
                pos = stop + 1
                continue
            start = found.start()
            index += data.count(b"\n", counted, start)
            counted = start
            newline = data.rfind(b"\n", pos, start)
            line_start = pos if newline < 0 else newline + 1
            line_end = data.find(b"\n", start)
            line_end = end if line_end < 0 else line_end
            if found.end() <= line_end:
                out.append((index, len(data[line_start:start].decode("utf-8", errors="replace"))))
            else:
                again = line_search(data[line_start:line_end].decode("utf-8", errors="replace"))
                if again is not None:
                    out.append((index, again.start()))
            if line_end >= end:
                return out
            pos = line_end + 1
            index += data.count(b"\n", counted, pos)
            counted = pos

    return run


def re2_compile(source: str | bytes) -> Any:
    options = re2.Options()
    options.log_errors = False
    return re2.compile(source, options)


def engines(source: str, case_sensitive: bool, timeout: float) -> dict[str, tuple[Searcher, str]]:
    """Each engine's searcher for one pattern and a note (``fallback``...)."""
    flags = 0 if case_sensitive else re.IGNORECASE
    out: dict[str, tuple[Searcher, str]] = {}
    try:
        compiled_re = re.compile(source, flags)
        out["re"] = (per_line(compiled_re.search), "")
    except re.error as exc:
        out["re"] = (lambda text: [], f"refused: {exc}")
    rx = regex.compile(source, regex.VERSION0 | (0 if case_sensitive else regex.IGNORECASE))
    out["regex per line"] = (per_line(lambda line: rx.search(line, concurrent=True, timeout=timeout)), "")

    def bounded(text: str) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        BoundedPattern(source, case_sensitive=case_sensitive, timeout=timeout).search_block(text, hits)
        return hits

    out["agentvfs (regex, block)"] = (bounded, search_mode(source))
    if re2 is not None:
        prefix = "" if case_sensitive else "(?i)"
        try:
            line2 = re2_compile(prefix + source)
            multi2 = re2_compile(("(?m)" + prefix + source).encode())
        except re2.error:
            out["re2 per line"] = (bounded, "refused: agentvfs instead")
            out["re2 block"] = (bounded, "refused: agentvfs instead")
        else:
            out["re2 per line"] = (per_line(line2.search), "")
            out["re2 block"] = (re2_block(line2.search, lambda t, a, b: multi2.search(t, a, b)), "")
    return out


def javascript_columns(patterns: list[tuple[str, str, bool]], lines: list[str]) -> list[list[int]] | None:
    """Per pattern, the code-point column of each line's first match in JavaScript (-1: none)."""
    node = shutil.which("node")
    if node is None:
        return None
    script = (
        "const fs=require('fs');const d=JSON.parse(fs.readFileSync(process.argv[1],'utf8'));"
        "const out=d.patterns.map(([s,cs])=>{let r;try{r=new RegExp(s,cs?'':'i')}catch(e){return null}"
        "return d.lines.map(l=>{const m=r.exec(l);return m?Array.from(l.slice(0,m.index)).length:-1})});"
        "fs.writeFileSync(process.argv[2],JSON.stringify(out));"
    )
    with tempfile.TemporaryDirectory() as tmp:
        given, taken = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(given, "w") as f:
            json.dump({"patterns": [[s, cs] for _, s, cs in patterns], "lines": lines}, f)
        subprocess.run([node, "-e", script, given, taken], check=True, timeout=600)
        with open(taken) as f:
            result: list[list[int]] = json.load(f)
        return result


def correctness(texts: list[str], timeout: float) -> list[str]:
    lines = [line for text in texts[:300] for line in text.split("\n")] + UNICODE_LINES
    block = "\n".join(lines)
    js = javascript_columns(PATTERNS, lines)
    names = ["regex per line", "agentvfs (regex, block)"] + (["re2 per line", "re2 block"] if re2 else [])
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip() if js else ""
    rows = [
        f"{len(lines):,} lines (the first 300 files and {len(UNICODE_LINES)} lines with non-ASCII letters, "
        f"digits and spaces); JavaScript: {'node ' + version if js else 'not installed'}. Each cell: lines "
        "whose first-match column differs from re's (the tool's results until now) / from JavaScript's.\n",
        "| pattern | re | " + " | ".join(names) + " | agentvfs search |",
        "|---|" + "---:|" * (len(names) + 1) + "---|",
    ]
    for number, (name, js_source, case_sensitive) in enumerate(PATTERNS):
        source = translate_js_regex(js_source)
        searchers = engines(source, case_sensitive, timeout)
        found = {engine: dict(run(block)) for engine, (run, _) in searchers.items()}
        reference = found["re"]
        javascript = None if js is None or js[number] is None else {i: c for i, c in enumerate(js[number]) if c >= 0}

        def differ(a: dict[int, int], b: dict[int, int] | None) -> str:
            return "n/a" if b is None else str(sum(1 for i in range(len(lines)) if a.get(i) != b.get(i)))

        cells = [f"0 / {differ(reference, javascript)}"]
        for engine in names:
            note = searchers[engine][1]
            shown = f"{differ(found[engine], reference)} / {differ(found[engine], javascript)}"
            cells.append(shown + (" (RE2 refuses it: agentvfs)" if note.startswith("refused") else ""))
        rows.append(f"| {name} `{js_source}` | " + " | ".join(cells) + f" | {searchers['agentvfs (regex, block)'][1]} |")
    return rows


def speed(texts: list[str], rounds: int, timeout: float) -> list[str]:
    names = ["re", "regex per line", "agentvfs (regex, block)"] + (["re2 per line", "re2 block"] if re2 else [])
    samples: dict[tuple[str, str], list[float]] = {}
    lines = sum(text.count("\n") + 1 for text in texts)
    for turn in range(rounds):
        for name, js_source, case_sensitive in PATTERNS:
            searchers = engines(translate_js_regex(js_source), case_sensitive, timeout)
            order = names[turn % len(names) :] + names[: turn % len(names)]
            for engine in order:
                run, _ = searchers[engine]
                started = time.perf_counter()
                for text in texts:
                    run(text)
                samples.setdefault((name, engine), []).append(time.perf_counter() - started)
    rows = [
        f"{len(texts):,} files, {lines:,} lines, {sum(map(len, texts)) / 1e6:.1f} M characters; median of {rounds} rounds, engines interleaved\n",
        "| pattern | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    totals = dict.fromkeys(names, 0.0)
    for name, js_source, _ in PATTERNS:
        cells = []
        for engine in names:
            median = statistics.median(samples[(name, engine)])
            totals[engine] += median
            cells.append(f"{median * 1000:,.0f} ms")
        rows.append(f"| {name} `{js_source}` | " + " | ".join(cells) + " |")
    rows.append("| **all patterns** | " + " | ".join(f"**{totals[e]:,.2f} s**" for e in names) + " |")
    return rows


def re_seconds(pattern: str, subject: str, cap: float) -> str:
    """Seconds ``re`` takes on a bomb, in a child process killed after ``cap`` seconds."""
    code = "import re,sys,time;p=re.compile(sys.argv[1]);t=time.perf_counter();p.search(sys.argv[2]);print(time.perf_counter()-t)"
    try:
        done = subprocess.run([sys.executable, "-c", code, pattern, subject], capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return f"> {cap:g} s (killed)"
    return f"{float(done.stdout):.3f} s"


async def ticks_while(work: Callable[[], object]) -> tuple[int, float, float]:
    """Run ``work`` in a worker thread; count 10 ms event-loop sleeps meanwhile and the
    longest gap between two."""
    done = threading.Event()
    count, worst = 0, 0.0

    async def ticker() -> None:
        nonlocal count, worst
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0.01)
            now = time.perf_counter()
            worst, last, count = max(worst, now - last), now, count + 1

    def job() -> None:
        try:
            work()
        finally:
            done.set()

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        await anyio.to_thread.run_sync(job)
    return count, worst, time.perf_counter() - started


def timed(work: Callable[[], object]) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        result = work()
    except (MatchTimeout, TimeoutError):
        return time.perf_counter() - started, "deadline"
    return time.perf_counter() - started, "match" if result else "no match"


def bomb_row(name: str, pattern: str, subject: str, deadline: float, cap: float) -> str:
    before = re_seconds(pattern, subject, cap)
    rx = regex.compile(pattern)
    one, outcome = timed(lambda: rx.search(subject, concurrent=True, timeout=deadline))
    text = "\n".join([subject] * 1000)

    def block() -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        BoundedPattern(pattern, timeout=deadline).search_block(text, hits)
        return hits

    def held() -> object:
        try:
            return rx.search(subject, concurrent=False, timeout=deadline)
        except TimeoutError:
            return None

    many, many_outcome = timed(block)
    count, worst, _ = anyio.run(ticks_while, lambda: timed(block))
    held_count, held_worst, _ = anyio.run(ticks_while, held)
    cells = [before, f"{one:.3f} s ({outcome})", f"{many:.3f} s ({many_outcome})",
             f"{count} ({worst * 1000:.0f} ms)", f"{held_count} ({held_worst * 1000:.0f} ms)"]
    if re2 is None:
        cells += ["n/a", "n/a", "n/a"]
    else:
        compiled = re2_compile(pattern)
        multi = re2_compile(("(?m)" + pattern).encode())
        run = re2_block(compiled.search, lambda t, a, b: multi.search(t, a, b))
        two, two_outcome = timed(lambda: compiled.search(subject))
        two_many, two_many_outcome = timed(lambda: run(text))
        two_count, two_worst, _ = anyio.run(ticks_while, lambda: run(text))
        cells += [f"{two * 1e6:.0f} µs ({two_outcome})", f"{two_many * 1000:.1f} ms ({two_many_outcome})",
                  f"{two_count} ({two_worst * 1000:.0f} ms)"]
    return f"| `{name}` | " + " | ".join(cells) + " |"


def bombs(deadline: float, cap: float) -> list[str]:
    rows = [
        f"deadline {deadline:g} s; a block is 1,000 copies of the line; ticks: 10 ms sleeps of an event loop while a worker thread runs the block\n",
        "| bomb | re (before) | regex, one line | agentvfs, block | ticks (max gap) | regex concurrent=False: ticks | re2, one line | re2, block | re2 ticks |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows += [bomb_row(name, pattern, subject, deadline, cap) for name, pattern, subject in BOMBS]
    return rows


def main(args: argparse.Namespace) -> None:
    texts = corpus(args.root, args.files)
    print("# Regex engines for grep (benchmarks/bench_regex.py)\n")
    print(f"Python {platform.python_version()}, regex {regex.__version__}, google-re2 "
          f"{metadata.version('google-re2') if re2 else 'not installed'}, {os.cpu_count()} CPUs\n")
    sections = args.sections.split(",")
    if "correctness" in sections:
        print("## Correctness\n")
        print("\n".join(correctness(texts, args.deadline)))
    if "speed" in sections:
        print("\n## Speed (ordinary grep)\n")
        print("\n".join(speed(texts, args.rounds, args.deadline * 10)))
    if "bombs" in sections:
        print("\n## Bombs\n")
        print("\n".join(bombs(args.deadline, args.re_cap)))
    print(f"\ncommand: python benchmarks/bench_regex.py --files {args.files} --rounds {args.rounds} "
          f"--deadline {args.deadline:g} --re-cap {args.re_cap:g} --sections {args.sections}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", help="a tree of .py files (default: the installed packages)")
    parser.add_argument("--deadline", type=float, default=1.0, help="seconds of matching per search")
    parser.add_argument("--re-cap", type=float, default=10.0, help="seconds before re is killed on a bomb")
    parser.add_argument("--sections", default="correctness,speed,bombs", help="which parts to run")
    main(parser.parse_args())
