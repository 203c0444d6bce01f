"""The cases the differential oracle runs: hand-written ones per tool, and seeded random ones.

Hand-written cases walk each tool's main and error paths. Random cases draw small trees
(names with spaces, unicode, astral characters, brackets, backslashes; binary files; a
``.gitignore``; symlinks inside and out) and sequences of calls across every tool, from a seed,
so a failure names a seed and a case that reproduce it.
"""

from __future__ import annotations

import random
import string
from typing import Any

from _oracle import Case, call, directory, file, symlink

ALL = {"sandbox": True, "bm25": True}

LONG_LINE = "start " + "abcdefghij" * 60 + " end"
ASTRAL_LINE = "😀" * 300 + " tail"


def _base_tree() -> list[dict[str, Any]]:
    return [
        file("a.txt", "alpha\nbeta\ngamma\n"),
        file("notes/todo.md", "# Todo\n\n- write tests\n- ship it\n", age=1),
        file("notes/Readme.MD", "Upper case extension\n", age=2),
        file(
            "src/main.py",
            "def main():\n    print('hello')\n\nif __name__ == '__main__':\n    main()\n",
            age=3,
        ),
        file("src/util.py", "import os\n\n\ndef helper(x):\n    return x * 2\n", age=4),
        file("img.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", age=5),
        file(".hidden", "secret\n", age=6),
        directory("empty", age=7),
        directory("notes", age=8),
        directory("src", age=9),
    ]


def hand_cases() -> list[Case]:
    """Every tool's main and error paths on small fixtures."""
    t = _base_tree
    return [
        # read_file
        Case(
            "read-basic",
            t(),
            [
                call("read_file", path="a.txt"),
                call("read_file", path="./a.txt"),
                call("read_file", path="a.txt", offset=2),
                call("read_file", path="a.txt", offset=2, limit=1),
                call("read_file", path="a.txt", showLineNumbers=False),
                call("read_file", path="a.txt", offset=10),
                call("read_file", path="src/main.py", limit=2),
                call("read_file", path="missing.txt"),
                call("read_file", path="notes"),
                call("read_file", path="img.png"),
                call("read_file", path="a.txt", encoding="base64"),
                call("read_file", path="a.txt", encoding="utf-8"),
            ],
        ),
        Case(
            "read-shapes",
            [
                file("empty.txt", ""),
                file("nonl.txt", "no newline at end"),
                file("crlf.txt", "one\r\ntwo\r\n"),
                file("long.txt", LONG_LINE + "\n"),
                file("astral.txt", ASTRAL_LINE + "\n"),
                file("bin.dat", b"\x00\x01\x02binary\xff"),
                file("latin1.txt", b"caf\xe9\n"),
                file("a.zip", b"PK\x03\x04rest"),
                file("data.jsonl", '{"a": 1}\n{"b": 2}\n'),
                file("query.sql", "select 1;\n"),
                file("page.php", "<?php echo 1; ?>\n"),
                file("photo.heic", b"heicdata"),
                file("song.ogg", b"OggS"),
                file("x.svg", "<svg/>\n"),
                file("y.json", '{"k": [1, 2]}\n'),
            ],
            [
                call("read_file", path=p)
                for p in [
                    "empty.txt",
                    "nonl.txt",
                    "crlf.txt",
                    "long.txt",
                    "astral.txt",
                    "bin.dat",
                    "latin1.txt",
                    "a.zip",
                    "./a.zip",
                    "data.jsonl",
                    "query.sql",
                    "page.php",
                    "photo.heic",
                    "song.ogg",
                    "x.svg",
                    "y.json",
                ]
            ],
        ),
        # write_file
        Case(
            "write",
            t(),
            [
                call("write_file", path="new.txt", content="fresh\n"),
                call("read_file", path="new.txt"),
                call("write_file", path="deep/er/file.txt", content="nested"),
                call("write_file", path="a.txt", content="over"),
                call("write_file", path="a.txt", content="again", overwrite=False),
                call("write_file", path="notes", content="x", overwrite=False),
                call("write_file", path="notes", content="x"),
                call("write_file", path="uni 😀.txt", content="ünï\n"),
                call("write_file", path="empty.txt", content=""),
                call("list_files", path="."),
            ],
        ),
        # edit_file
        Case(
            "edit",
            [
                file("e.txt", "x\ny\nz\ny\n"),
                file("f.txt", "one two one\nthree\n"),
                file("g.txt", "a\n\nb\n\nc\n"),
            ],
            [
                call("edit_file", path="e.txt", old_string="z", new_string="Z"),
                call("edit_file", path="e.txt", old_string="y", new_string="Y"),
                call(
                    "edit_file", path="e.txt", old_string="y\n", new_string="Y\n", replace_all=True
                ),
                call("edit_file", path="f.txt", old_string="one", new_string="1", replace_all=True),
                call("edit_file", path="f.txt", old_string="absent", new_string="x"),
                call("edit_file", path="g.txt", old_string="\n", new_string="\n", replace_all=True),
                call("edit_file", path="g.txt", old_string="b\n", new_string="B\n"),
                call("edit_file", path="g.txt", old_string="a\n\nB", new_string="ab"),
                call("edit_file", path="missing.txt", old_string="a", new_string="b"),
                call("edit_file", path="f.txt", old_string="three", new_string="three"),
                call("read_file", path="e.txt"),
                call("read_file", path="f.txt"),
                call("read_file", path="g.txt"),
            ],
        ),
        # list_files
        Case(
            "list",
            [
                *t(),
                file("notes/deep/deeper/x.txt", "x", age=10),
                file("src/app.TS", "let x = 1\n", age=11),
                file("src/app.ts", "let y = 2\n", age=12),
                file("build/out.log", "log\n", age=13),
                file(".gitignore", "build/\n*.LOG\n", age=14),
                directory(".git", age=15),
                file(".git/HEAD", "ref: refs/heads/main\n", age=16),
            ],
            [
                call("list_files", path="."),
                call("list_files", path="/"),
                call("list_files", path="notes", maxDepth=1),
                call("list_files", path=".", maxDepth=5),
                call("list_files", path=".", showHidden=True),
                call("list_files", path=".", dirsOnly=True),
                call("list_files", path=".", exclude="notes"),
                call("list_files", path=".", extension=".ts"),
                call("list_files", path=".", extension="ts"),
                call("list_files", path=".", pattern="**/*.py"),
                call("list_files", path=".", pattern="*.txt"),
                call("list_files", path=".", respectGitignore=False),
                call("list_files", path="missing"),
                call("list_files", path="a.txt"),
                call("list_files", path=".git"),
                call("list_files", path="empty"),
            ],
        ),
        # delete, mkdir, file_stat
        Case(
            "delete-mkdir-stat",
            t(),
            [
                call("file_stat", path="a.txt"),
                call("file_stat", path="notes"),
                call("file_stat", path="missing"),
                call("mkdir", path="made/inner"),
                call("mkdir", path="made2", recursive=False),
                call("mkdir", path="x/y", recursive=False),
                call("mkdir", path="a.txt"),
                call("file_stat", path="made"),
                call("delete", path="a.txt"),
                call("delete", path="a.txt"),
                call("delete", path="notes"),
                call("delete", path="notes", recursive=True),
                call("delete", path="empty"),
                call("list_files", path="."),
            ],
        ),
        # grep
        Case(
            "grep",
            [
                *t(),
                file("long.txt", "x " + LONG_LINE + "\n"),
                file("astral.txt", ASTRAL_LINE + " needle\n"),
                file("[br]ackets.md", "needle in brackets\n"),
                file("sub/b.txt", "needle\ncontext after\n"),
                file("sub/A.txt", "Needle upper\n"),
            ],
            [
                call("grep", pattern="needle"),
                call("grep", pattern="needle", caseSensitive=False),
                call("grep", pattern="needle", contextLines=1),
                call("grep", pattern="needle", maxCount=1),
                call("grep", pattern="needle", path="sub"),
                call("grep", pattern="def \\w+"),
                call("grep", pattern="abcdefghij"),
                call("grep", pattern="tail"),
                call("grep", pattern="secret"),
                call("grep", pattern="secret", includeHidden=True),
                call("grep", pattern="nomatchanywhere"),
                call("grep", pattern="("),
                call("grep", pattern="needle", path="missing"),
                call("grep", pattern="^- "),
                call("grep", pattern="(?:a{1000}){1000}"),
                call("grep", pattern="(?i)todo"),
                call("grep", pattern="\\Aalpha"),
                call("grep", pattern="(?<w>ne)edle \\k<w>"),
            ],
        ),
        # sandbox
        Case(
            "exec",
            t(),
            [
                call("execute_command", command="echo hi"),
                call("execute_command", command="printf 'a\\n\\n'"),
                call("execute_command", command="printf 'no newline'"),
                call("execute_command", command="echo out; echo err >&2"),
                call("execute_command", command="echo err >&2; exit 3"),
                call("execute_command", command="exit 1"),
                call("execute_command", command="true"),
                call("execute_command", command="cat a.txt"),
                call("execute_command", command="ls"),
                call("execute_command", command="pwd", cwd="notes"),
                call("execute_command", command="seq 1 200", tail=5),
                call("execute_command", command="printf '\\033[31mred\\033[0m\\n'"),
                call("execute_command", command="pwd", cwd="no-such-dir"),
                call("execute_command", command="seq 1 400000"),
                call("execute_command", command="sleep 0.1", background=True),
                call("get_process_output", pid="$PID", wait=True),
                call("execute_command", command="sleep 0.2; echo bg done", background=True),
                call("get_process_output", pid="$PID", wait=True),
                call("get_process_output", pid="$PID"),
                call("kill_process", pid="$PID"),
                call("execute_command", command="sleep 30", background=True),
                call("kill_process", pid="$PID"),
                call("get_process_output", pid="999999"),
                call("kill_process", pid="999999"),
            ],
            dict(ALL),
        ),
        # search and index
        Case(
            "search",
            [
                *t(),
                file("docs/alpha.md", "Alpha particles and beta rays.\n" * 3),
                file("docs/beta.md", "Beta testing notes for the release.\n"),
            ],
            [
                call("search", query="beta"),
                call("search", query="beta", topK=1),
                call("search", query="nothing matches this"),
                call("index", path="mem/one.md", content="the quick brown fox\njumps over\n"),
                call("search", query="fox"),
                call("search", query="fox", minScore=100),
                call("search", query="beta", mode="bm25"),
                call("search", query="beta", mode="vector"),
            ],
            {"bm25": True, "auto_index_paths": ["docs"]},
        ),
        Case(
            "search-vector",
            [
                *t(),
                file("docs/alpha.md", "Alpha particles and beta rays.\n" * 3),
                file("docs/beta.md", "Beta testing notes for the release.\n"),
                file("docs/gamma.md", "gamma gamma kappa delta\nfinal line\n"),
            ],
            [
                call("search", query="gamma", mode="vector"),
                call("search", query="kappa delta", mode="vector", topK=2),
                call("search", query="gamma", mode="hybrid"),
                call("search", query="beta release", mode="hybrid", topK=2),
                call("search", query="gamma"),
                call("search", query="gamma", mode="hybrid", minScore=0.6),
                call("search", query="gamma", mode="vector", minScore=0.9),
                call("index", path="mem/new.md", content="zebra zebra gamma\n"),
                call("search", query="zebra", mode="vector", topK=1),
                call("write_file", path="docs/beta.md", content="replaced\n"),
                call("search", query="beta", mode="hybrid"),
            ],
            {"bm25": True, "vector": True, "auto_index_paths": ["docs"]},
            inspect=True,
        ),
        Case(
            "search-chunks",
            [
                file("big.md", "".join(f"line {i} word{i % 7} filler text\n" for i in range(300))),
                file("small.md", "just one line with word3\n"),
            ],
            [
                call("search", query="word3", topK=10),
                call("search", query="line 299"),
                call("search", query="filler", topK=3),
            ],
            {"bm25": True, "auto_index_paths": ["."]},
        ),
        # The tool set, the instructions and get_info, in every configuration.
        Case("inspect-all", t(), [call("read_file", path="a.txt")], dict(ALL), inspect=True),
        Case("inspect-fs-only", t(), [], {}, inspect=True),
        Case(
            "inspect-read-only",
            t(),
            [
                call("write_file", path="a.txt", content="no"),
                call("read_file", path="a.txt"),
            ],
            {"read_only": True, "sandbox": True},
            inspect=True,
        ),
        Case(
            "config",
            t(),
            [
                call("write_file", path="a.txt", content="not read yet"),
                call("read_file", path="a.txt"),
                call("write_file", path="a.txt", content="read first\n"),
                call("write_file", path="a.txt", content="again without a read"),
                call("write_file", path="brand-new.txt", content="new files need no read"),
                call("ls", path="."),
                call("grep", pattern="alpha"),
                call("edit_file", path="src/util.py", old_string="x * 2", new_string="x * 3"),
                call("read_file", path="src/util.py"),
                call("edit_file", path="src/util.py", old_string="x * 2", new_string="x * 3"),
                call("edit_file", path="src/util.py", old_string="x * 3", new_string="x * 4"),
            ],
            {
                "sandbox": True,
                "tools": {
                    "requireApproval": True,
                    "mastra_workspace_read_file": {"requireApproval": False},
                    "mastra_workspace_list_files": {"name": "ls"},
                    "mastra_workspace_grep": {"enabled": False},
                    "mastra_workspace_write_file": {"requireReadBeforeWrite": True},
                    "mastra_workspace_edit_file": {"requireReadBeforeWrite": True},
                    "mastra_workspace_kill_process": {"enabled": False},
                },
            },
            inspect=True,
        ),
        Case(
            "hooks",
            t(),
            [
                call("read_file", path="a.txt"),
                call("read_file", path="blocked.txt"),
                call("read_file", path="missing.txt"),
                call("write_file", path="blocked.txt", content="never"),
                call("write_file", path="w.txt", content="written"),
                call("list_files", path="notes"),
                call("execute_command", command="echo hooked"),
            ],
            {"sandbox": True, "hooks": "log"},
        ),
        Case(
            "token-limits",
            [
                *t(),
                file("big.txt", "".join(f"row {i}: some words to count\n" for i in range(400))),
                file("deep/a/b/c/d.txt", "x\n"),
            ],
            [
                call("read_file", path="big.txt"),
                call("list_files", path=".", maxDepth=6),
                call("grep", pattern="row"),
                call("execute_command", command="seq 1 300"),
                call("execute_command", command="seq 1 3"),
            ],
            {
                "sandbox": True,
                "tools": {
                    "mastra_workspace_read_file": {"maxOutputTokens": 60},
                    "mastra_workspace_list_files": {"maxOutputTokens": 20},
                    "mastra_workspace_grep": {"maxOutputTokens": 40},
                    "mastra_workspace_execute_command": {"maxOutputTokens": 50},
                },
            },
        ),
        Case(
            "skills",
            [
                *t(),
                file(
                    "skills/release-notes/SKILL.md",
                    "---\nname: release-notes\ndescription: Write release notes from merged pull requests.\n---\n\n"
                    "# Release notes\n\nCollect merged pull requests and group them by label.\n",
                ),
                file(
                    "skills/release-notes/references/style.md",
                    "# Style\n\nShort lines.\nPast tense.\nNo emoji.\n",
                ),
                file(
                    "skills/release-notes/scripts/collect.sh", "#!/bin/sh\necho collect\n", mode=493
                ),
                file(
                    "skills/pdf/SKILL.md",
                    "---\nname: pdf\ndescription: Read and fill PDF forms.\n---\n\nUse pdftotext for text.\n",
                ),
                file("skills/pdf/assets/blank.bin", b"\x00\x01\x02"),
            ],
            [
                call("skill", name="release-notes"),
                call("skill", name="pdf"),
                call("skill", name="nope"),
                call("skill_search", query="pull request"),
                call("skill_search", query="pdf forms", topK=1),
                call("skill_search", query="zzzz"),
                call("skill_read", skillName="release-notes", path="references/style.md"),
                call(
                    "skill_read",
                    skillName="release-notes",
                    path="references/style.md",
                    startLine=3,
                    endLine=4,
                ),
                call(
                    "skill_read",
                    skillName="release-notes",
                    path="references/style.md",
                    startLine=30,
                ),
                call("skill_read", skillName="release-notes", path="references/none.md"),
                call("skill_read", skillName="pdf", path="assets/blank.bin"),
            ],
            {"skills": ["skills"], "bm25": True},
            inspect=True,
        ),
        # Where the reference is unsafe, agentvfs refuses (docs/differences-from-mastra.md).
        Case(
            "unsafe",
            [
                file("a.txt", "x\n"),
                file("latin1.txt", b"caf\xe9 menu\n"),
                file("../outside/o.txt", "outside\n"),
                symlink("link-out.txt", "../outside/o.txt"),
                symlink("link-outdir", "../outside"),
                symlink("link-dangling", "sub/inner"),
            ],
            [
                call("mkdir", path="link-dangling"),
                call("mkdir", path="link-dangling", recursive=False),
                call("write_file", path="link-outdir/new.txt", content="escaped"),
                call("read_file", path="link-outdir/o.txt"),
                call("list_files", path="link-outdir"),
                call("read_file", path="link-out.txt"),
                call("write_file", path="link-out.txt", content="changed"),
                call("edit_file", path="latin1.txt", old_string="menu", new_string="carte"),
                call("delete", path="./", recursive=True),
            ],
        ),
    ]


# -- random cases -------------------------------------------------------------------------------

_NAMES = [
    "a.txt",
    "B.md",
    "notes one.txt",
    "é.txt",
    "日本.md",
    "𝒳.txt",
    "😀.md",
    "[br]ackets.md",
    "back\\slash.txt",
    ".hidden",
    "x.JSON",
    "data.jsonl",
    "Zeta.py",
    "alpha.py",
    "ü.txt",
    "a b c.log",
    "UPPER.TXT",
    "mixed.Md",
    "q?.txt",
    "star*.md",
    "{brace}.txt",
    "z.sql",
    "tab\there.txt",
]
_DIRS = ["src", "docs", "Sub Dir", "ü", "[x]", ".cache", "build", "A"]
_WORDS = [
    "alpha",
    "beta",
    "Gamma",
    "delta",
    "needle",
    "haystack",
    "fox",
    "über",
    "naïve",
    "日本語",
    "😀",
    "𝒳",
    "foo_bar",
    "TODO",
    "x=1",
    "(paren)",
    "[bracket]",
    "a.b",
    "line",
    "word",
]
_COMMANDS = [
    "echo hi",
    "printf 'a\\n\\n'",
    "printf 'x'",
    "echo out; echo err >&2",
    "echo err >&2; exit 3",
    "exit 1",
    "true",
    "ls",
    "seq 1 30",
    "wc -l < a.txt",
    "cat a.txt",
    "printf 'é😀\\n'",
    "ls -a",
    "echo $((6 * 7))",
    "printf '\\033[1mbold\\033[0m\\n'",
]
_PATTERNS = [
    "needle",
    "alpha|beta",
    "^line",
    "o$",
    "\\d+",
    "[A-Z]\\w+",
    "😀",
    "𝒳",
    "über",
    "a.b",
    "(paren)",
    "\\(paren\\)",
    "[",
    "x=1",
    "\\bfox\\b",
    "日本",
    "TODO",
    "(?i)todo",
    "\\s{2,}",
    ".",
]


def _text(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        if kind < 0.05:
            lines.append("w" * rng.randint(490, 620))
        elif kind < 0.1:
            lines.append("😀" * rng.randint(240, 320))
        elif kind < 0.15:
            lines.append("")
        else:
            lines.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 8))))
    sep = "\r\n" if rng.random() < 0.1 else "\n"
    body = sep.join(lines)
    return body + (sep if lines and rng.random() < 0.8 else "")


def random_case(rng: random.Random, case_id: str) -> Case:
    """One random tree and a random sequence of calls over it."""
    files: list[dict[str, Any]] = []
    texts: dict[str, str] = {}
    dirs = ["", *rng.sample(_DIRS, rng.randint(0, 3))]
    for d in dirs[1:]:
        files.append(directory(d, age=rng.randint(0, 50)))
    used = set()
    for _ in range(rng.randint(1, 8)):
        d = rng.choice(dirs)
        name = rng.choice(_NAMES)
        path = f"{d}/{name}" if d else name
        if path in used:
            continue
        used.add(path)
        if rng.random() < 0.12:
            files.append(
                file(
                    path,
                    bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))),
                    age=rng.randint(0, 50),
                )
            )
        else:
            texts[path] = _text(rng)
            files.append(file(path, texts[path], age=rng.randint(0, 50)))
    if rng.random() < 0.3:
        files.append(
            file(
                ".gitignore",
                rng.choice(["*.log\n", "build/\n", "SECRET*\n*.md\n", "UPPER.txt\n", "docs\n"]),
            )
        )
    if rng.random() < 0.3 and texts:
        files.append(symlink("link-in.txt", rng.choice(sorted(texts))))
    if rng.random() < 0.2:
        files.append(file("../outside/o.txt", "outside the workspace\n"))
        files.append(symlink("link-out.txt", "../outside/o.txt"))
    paths = sorted(texts) or ["a.txt"]
    every = (
        sorted(used) + [d for d in dirs if d] + ["missing.txt", ".", "link-in.txt", "link-out.txt"]
    )
    calls: list[dict[str, Any]] = []
    sandbox = rng.random() < 0.5
    search = rng.random() < 0.4
    for _ in range(rng.randint(3, 12)):
        tool = rng.choice(
            ["read_file"] * 4
            + [
                "write_file",
                "edit_file",
                "edit_file",
                "list_files",
                "list_files",
                "delete",
                "file_stat",
                "mkdir",
                "grep",
                "grep",
                "grep",
            ]
            + (["execute_command"] * 3 + ["background"] if sandbox else [])
            + (["search", "search", "index"] if search else [])
        )
        p = rng.choice(every)
        if tool == "read_file":
            args: dict[str, Any] = {"path": rng.choice(paths + every)}
            if rng.random() < 0.3:
                args["offset"] = rng.randint(1, 6)
            if rng.random() < 0.3:
                args["limit"] = rng.randint(1, 6)
            calls.append(call("read_file", **args))
        elif tool == "write_file":
            args = {
                "path": rng.choice([*paths, f"{rng.choice(dirs) or 'new'}/{rng.choice(_NAMES)}"]),
                "content": _text(rng),
            }
            if rng.random() < 0.3:
                args["overwrite"] = rng.random() < 0.5
            calls.append(call("write_file", **args))
        elif tool == "edit_file":
            path = rng.choice(paths)
            text = texts.get(path, "")
            if text and rng.random() < 0.8:
                start = rng.randrange(len(text))
                old = text[start : start + rng.randint(1, 12)]
            else:
                old = rng.choice(["\n", "alpha", "zzz", " "])
            args = {
                "path": path,
                "old_string": old,
                "new_string": rng.choice(["", "X", "new\nlines", old.upper(), "😀"]),
            }
            if rng.random() < 0.4:
                args["replace_all"] = True
            calls.append(call("edit_file", **args))
        elif tool == "list_files":
            args = {"path": rng.choice([".", "/", *[d for d in dirs if d], "missing"])}
            options: dict[str, list[Any]] = {
                "maxDepth": [1, 2, 5],
                "showHidden": [True, False],
                "dirsOnly": [True],
                "exclude": ["src", "*.md"],
                "extension": [".md", ".txt", "md", ".TXT"],
                "pattern": ["*.md", "**/*.txt", "src/**"],
                "respectGitignore": [False],
            }
            for key, values in options.items():
                if rng.random() < 0.2:
                    args[key] = rng.choice(values)
            calls.append(call("list_files", **args))
        elif tool == "delete":
            args = {"path": p}
            if rng.random() < 0.5:
                args["recursive"] = True
            if p in (".", ""):
                continue  # deleting the workspace itself is a deliberate difference (see the docs)
            calls.append(call("delete", **args))
        elif tool == "file_stat":
            calls.append(call("file_stat", path=p))
        elif tool == "mkdir":
            calls.append(
                call(
                    "mkdir", path=rng.choice([f"{rng.choice(dirs) or 'nd'}/{rng.choice(_DIRS)}", p])
                )
            )
        elif tool == "grep":
            args = {"pattern": rng.choice(_PATTERNS + _WORDS)}
            if rng.random() < 0.3:
                args["contextLines"] = rng.randint(1, 3)
            if rng.random() < 0.2:
                args["maxCount"] = rng.randint(1, 3)
            if rng.random() < 0.3:
                args["caseSensitive"] = False
            if rng.random() < 0.2:
                args["includeHidden"] = True
            if rng.random() < 0.2:
                args["path"] = rng.choice([d for d in dirs if d] or ["."])
            calls.append(call("grep", **args))
        elif tool == "execute_command":
            calls.append(call("execute_command", command=rng.choice(_COMMANDS)))
        elif tool == "background":
            calls.append(
                call("execute_command", command="sleep 0.1; echo bg; echo e >&2", background=True)
            )
            calls.append(call("get_process_output", pid="$PID", wait=True))
            if rng.random() < 0.5:
                calls.append(call("kill_process", pid="$PID"))
        elif tool == "search":
            args = {"query": " ".join(rng.sample(_WORDS, rng.randint(1, 3)))}
            if rng.random() < 0.3:
                args["topK"] = rng.randint(1, 4)
            if rng.random() < 0.5:
                args["mode"] = rng.choice(["bm25", "vector", "hybrid"])
            calls.append(call("search", **args))
        elif tool == "index":
            calls.append(
                call(
                    "index", path=f"mem/{rng.choice(string.ascii_lowercase)}.md", content=_text(rng)
                )
            )
    workspace: dict[str, Any] = {}
    if sandbox:
        workspace["sandbox"] = True
    if search:
        workspace["bm25"] = True
        if rng.random() < 0.5:
            workspace["vector"] = True
        if rng.random() < 0.7:
            workspace["auto_index_paths"] = ["."]
    return Case(case_id, files, calls, workspace)


def random_cases(seed: int, count: int) -> list[Case]:
    """``count`` random cases from ``seed`` (ids ``r<seed>-<n>``)."""
    rng = random.Random(seed)
    return [random_case(rng, f"r{seed}-{n}") for n in range(count)]
