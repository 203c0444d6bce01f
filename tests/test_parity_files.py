"""read_file, write_file, edit_file and list_files answer as the reference does, byte for byte:
edited line ranges, the MIME table and its text/binary decisions, the path read_file's headers
name, list_files' extension filter, ``.git`` targets and order, and case-insensitive
``.gitignore`` rules."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentvfs import WORKSPACE_TOOLS, LocalFilesystem, ToolMedia, Workspace, WorkspaceTool
from agentvfs.errors import FileExists, IsDirectory
from agentvfs.tools._listing import fold_case, gitignore_spec
from agentvfs.vfs import TEXT_EXTENSIONS, get_mime_type, is_text_file

pytestmark = pytest.mark.anyio
FS = WORKSPACE_TOOLS.FILESYSTEM

BINARY_HINT = (
    " — binary file not readable as text. Pass an explicit `encoding` (e.g. `base64`) to read the raw "
    "bytes, or configure `media_types` on the read_file tool to surface it as a media part."
)


async def workspace_tools(root: Path, files: Mapping[str, bytes | str], dirs: tuple[str, ...] = ()) -> dict[str, WorkspaceTool]:
    for name in dirs:
        (root / name).mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
    return await Workspace(filesystem=LocalFilesystem(base_path=str(root))).create_tools()


async def call(tools: dict[str, WorkspaceTool], name: str, **args: Any) -> Any:
    return await tools[name].execute(args)


# --- edit_file: the lines an edit names ------------------------------------------------


@pytest.mark.parametrize(
    ("content", "old", "new", "every", "lines"),
    [
        # A newline ending old_string belongs to the line it ends.
        ("x\ny\nz\n", "y\n", "Y", False, "(lines 2)"),
        # ... but new_string's lines count when there are more of them.
        ("x\ny\nz\n", "y\n", "Y\n", False, "(lines 2-3)"),
        ("x\ny\nz\n", "x\ny\n", "X", False, "(lines 1-2)"),
        ("x\ny\nz\n", "\nz\n", "", False, "(lines 2-3)"),
        ("x\ny\nz\n", "\n", "", True, "(lines 1, 2, 3)"),
        ("x\ny\nz\n", "\n", "\n\n", True, "(lines 1-3, 2-4, 3-5)"),
        ("a\n\n\nb\n\n\nc", "\n\n", "--", True, "(lines 1-2, 4-5)"),
        ("a\n\nb\n\n", "\n\n", "\n", True, "(lines 1-2, 3-4)"),
        ("a\n\n\nb", "\n\n\n", "X", False, "(lines 1-3)"),
        ("ab\nab\nab", "ab", "q\nr\ns", True, "(lines 1-3, 2-4, 3-5)"),
        ("ab\nab\nab", "b\na", "Z", True, "(lines 1-2, 2-3)"),
        ("x\r\ny\r\n", "\r\n", "\n", True, "(lines 1-2, 2-3)"),
        ("one\ntwo\nthree", "two\nthree", "2", False, "(lines 2-3)"),
        ("\n", "\n", "", False, "(lines 1)"),
        # Occurrences do not overlap; two on one line name it twice.
        ("aaaa", "aa", "b", True, "(lines 1, 1)"),
        ("p\nq\n", "q\n", "", False, "(lines 2)"),
        ("é\nü\n€\n😀\n", "😀", "x\ny", False, "(lines 4-5)"),
    ],
)
async def test_edit_line_ranges(tmp_path: Path, content: str, old: str, new: str, every: bool, lines: str) -> None:
    tools = await workspace_tools(tmp_path, {"f.txt": content})
    out = await call(tools, FS.EDIT_FILE, path="f.txt", old_string=old, new_string=new, replace_all=every)
    count = content.count(old) if every else 1
    assert out == f"Replaced {count} occurrence{'s' if count != 1 else ''} in f.txt {lines}"
    assert (tmp_path / "f.txt").read_text() == (content.replace(old, new) if every else content.replace(old, new, 1))


# --- MIME types and what read_file reads as text ----------------------------------------

MIME_TABLE = {
    "txt": "text/plain", "html": "text/html", "htm": "text/html", "css": "text/css", "csv": "text/csv",
    "md": "text/markdown", "js": "application/javascript", "mjs": "application/javascript",
    "ts": "application/typescript", "tsx": "application/typescript", "jsx": "application/javascript",
    "json": "application/json", "xml": "application/xml", "yaml": "text/yaml", "yml": "text/yaml",
    "py": "text/x-python", "rb": "text/x-ruby", "go": "text/x-go", "rs": "text/x-rust", "java": "text/x-java",
    "c": "text/x-c", "cpp": "text/x-c++", "h": "text/x-c", "hpp": "text/x-c++", "sh": "text/x-sh",
    "bash": "text/x-sh", "zsh": "text/x-sh", "toml": "text/toml", "ini": "text/plain", "env": "text/plain",
    "sql": "text/x-sql", "graphql": "application/graphql", "gql": "application/graphql", "vue": "text/x-vue",
    "svelte": "text/x-svelte", "scss": "text/x-scss", "sass": "text/x-sass", "less": "text/x-less",
    "php": "application/x-php", "swift": "text/x-swift", "kt": "text/x-kotlin", "kts": "text/x-kotlin",
    "dart": "application/dart", "lua": "text/x-lua", "r": "text/x-r", "tf": "text/x-terraform",
    "tfvars": "text/x-terraform", "mdx": "text/markdown", "sas": "text/plain", "log": "text/plain",
    "jsonl": "application/jsonl", "png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg",
    "gif": "image/gif", "svg": "image/svg+xml", "webp": "image/webp", "ico": "image/x-icon", "bmp": "image/bmp",
    "tiff": "image/tiff", "tif": "image/tiff", "heic": "image/heic", "heif": "image/heif", "avif": "image/avif",
    "pdf": "application/pdf", "mp3": "audio/mpeg", "wav": "audio/wav", "ogg": "audio/ogg", "flac": "audio/flac",
    "m4a": "audio/mp4", "aac": "audio/aac", "mp4": "video/mp4", "webm": "video/webm", "mov": "video/quicktime",
    "avi": "video/x-msvideo", "mkv": "video/x-matroska", "zip": "application/zip", "tar": "application/x-tar",
    "gz": "application/gzip", "tgz": "application/gzip", "bz2": "application/x-bzip2",
    "7z": "application/x-7z-compressed", "rar": "application/vnd.rar",
    "exe": "application/vnd.microsoft.portable-executable",
    "dll": "application/vnd.microsoft.portable-executable", "so": "application/x-sharedlib",
    "dylib": "application/x-sharedlib", "bin": "application/x-binary", "dat": "application/x-binary",
    "dmg": "application/x-apple-diskimage", "iso": "application/x-iso9660-image",
    "deb": "application/vnd.debian.binary-package", "rpm": "application/x-rpm", "doc": "application/msword",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xls": "application/vnd.ms-excel",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "ppt": "application/vnd.ms-powerpoint",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "ttf": "font/ttf", "otf": "font/otf", "woff": "font/woff", "woff2": "font/woff2", "wasm": "application/wasm",
    "class": "application/java-vm", "pyc": "application/x-python-code",
}  # fmt: skip

#: Extensions read_file reads as text without an encoding (the rest answer binary-not-readable,
#: or come back as media: png, jpg, jpeg, webp, pdf).
TEXT_READ = {
    "txt", "html", "htm", "css", "csv", "md", "js", "mjs", "ts", "tsx", "jsx", "json", "xml", "yaml", "yml",
    "py", "rb", "go", "rs", "java", "c", "cpp", "h", "hpp", "sh", "bash", "zsh", "toml", "ini", "env", "sql",
    "graphql", "gql", "vue", "svelte", "scss", "sass", "less", "swift", "kt", "kts", "lua", "r", "tf",
    "tfvars", "mdx", "sas", "log", "svg",
}  # fmt: skip
MEDIA = {"png", "jpg", "jpeg", "webp", "pdf"}


def test_mime_table() -> None:
    assert len(MIME_TABLE) == 106
    for ext, mime in MIME_TABLE.items():
        assert get_mime_type(f"a.{ext}") == mime
        assert get_mime_type(f"dir/A.{ext.upper()}") == mime
    # Not in the table: the generic type (read as text).
    for name in ("a.cjs", "a.tsv", "a.markdown", "a.cfg", "a.conf", "a.", "noext", ".env", "a.unknown"):
        assert get_mime_type(name) == "application/octet-stream"
    # The extension is what follows the last dot, unless the name only starts with one.
    assert get_mime_type("..md") == "text/markdown"
    assert get_mime_type(".x.json") == "application/json"
    assert len(TEXT_EXTENSIONS) == 52
    assert is_text_file("a.jsonl") and is_text_file("a.PHP") and not is_text_file("a.cjs")


async def test_read_file_text_or_binary_by_extension(tmp_path: Path) -> None:
    tools = await workspace_tools(tmp_path, {f"f.{ext}": "hello\nworld\n" for ext in MIME_TABLE})
    for ext, mime in MIME_TABLE.items():
        out = await call(tools, FS.READ_FILE, path=f"f.{ext}")
        if ext in MEDIA:
            assert isinstance(out, ToolMedia) and out.text == f"f.{ext} (12 bytes, {mime})"
        elif ext in TEXT_READ:
            assert out == f"f.{ext} (12 bytes)\n     1→hello\n     2→world\n     3→", ext
        else:
            assert out == f"f.{ext} (12 bytes, {mime}){BINARY_HINT}", ext
    # An explicit text encoding reads any of them as text.
    assert await call(tools, FS.READ_FILE, path="f.jsonl", encoding="utf-8") == (
        "f.jsonl (12 bytes)\n     1→hello\n     2→world\n     3→"
    )


# --- read_file headers name the normalised path ------------------------------------------


async def test_read_file_headers_name_the_normalised_path(tmp_path: Path) -> None:
    tools = await workspace_tools(
        tmp_path, {"f.zip": "hello\nworld\n", "dir/b\\c.zip": "PK", "back\\slash.txt": "t\n", "f.txt": "hello\n"}
    )
    assert await call(tools, FS.READ_FILE, path="./f.zip") == f"f.zip (12 bytes, application/zip){BINARY_HINT}"
    assert await call(tools, FS.READ_FILE, path="./f.zip", encoding="hex") == "f.zip (12 bytes, hex)\n68656c6c6f0a776f726c640a"
    assert await call(tools, FS.READ_FILE, path="dir/../f.zip", encoding="base64") == "f.zip (12 bytes, base64)\naGVsbG8Kd29ybGQK"
    assert await call(tools, FS.READ_FILE, path="./f.zip", encoding="binary") == "f.zip (12 bytes, binary)\nhello\nworld\n"
    # A backslash in a name is shown as a slash.
    assert await call(tools, FS.READ_FILE, path="./dir/b\\c.zip") == f"dir/b/c.zip (2 bytes, application/zip){BINARY_HINT}"
    assert await call(tools, FS.READ_FILE, path="./back\\slash.txt") == "back/slash.txt (2 bytes)\n     1→t\n     2→"
    assert await call(tools, FS.READ_FILE, path="./back\\slash.txt", offset=1, limit=1) == (
        "back/slash.txt (lines 1-1 of 2, 2 bytes)\n     1→t"
    )
    assert await call(tools, FS.READ_FILE, path="dir//../f.txt") == "f.txt (6 bytes)\n     1→hello\n     2→"


async def test_read_file_oversized_media_names_the_normalised_path(tmp_path: Path) -> None:
    (tmp_path / "big.png").write_bytes(b"x" * 100)
    (tmp_path / "a.pdf").write_bytes(b"y" * 3)
    tools = await Workspace(
        filesystem=LocalFilesystem(base_path=str(tmp_path)), tools={FS.READ_FILE: {"max_media_bytes": 2}}
    ).create_tools()
    assert await call(tools, FS.READ_FILE, path="./big.png") == (
        "big.png (100 bytes, image/png) — exceeds max_media_bytes (2). Returning metadata only; "
        "configure `max_media_bytes` on the read_file tool to raise this cap."
    )
    assert await call(tools, FS.READ_FILE, path="./a.pdf", encoding="hex") == "a.pdf (3 bytes, hex)\n797979"


# --- list_files ------------------------------------------------------------------------

LISTING = {
    "a.TS": "", "b.ts": "", "c.Ts": "", "d.tsx": "", "src/e.ts": "", "src/F.TS": "", ".git/config": "",
    ".git/HEAD": "", "sub/.git/x": "", "sub/y.txt": "", "Zeta.py": "", "alpha.py": "", "ü.txt": "",
    "😀.txt": "", "\uff5e.txt": "", "a b c.log": "", "_u.txt": "", "Ab": "", "ab": "", "B": "",
    "sub/nested/deep/z.txt": "", "node_modules/m.js": "", "xa.ts": "", "ex a": "",
}  # fmt: skip


@pytest.fixture
async def listing(tmp_path: Path) -> dict[str, WorkspaceTool]:
    return await workspace_tools(tmp_path, LISTING)


async def test_list_files_orders_by_utf16_code_units(listing: dict[str, WorkspaceTool]) -> None:
    # U+1F600 is a surrogate pair (0xD83D ...) and sorts before U+FF5E.
    assert await call(listing, FS.LIST_FILES, path=".") == (
        ".\nnode_modules\n\tm.js\nsrc\n\tF.TS\n\te.ts\nsub\n\tnested\n\ty.txt\nAb\nB\nZeta.py\n_u.txt\n"
        "a b c.log\na.TS\nab\nalpha.py\nb.ts\nc.Ts\nd.tsx\nex a\nxa.ts\nü.txt\n😀.txt\n～.txt\n\n"
        "4 directories, 20 files (truncated at depth 2)"
    )


async def test_list_files_extension_is_case_sensitive(listing: dict[str, WorkspaceTool]) -> None:
    assert await call(listing, FS.LIST_FILES, path=".", extension="ts") == (
        ".\nnode_modules\nsrc\n\te.ts\nsub\n\tnested\nb.ts\nxa.ts\n\n4 directories, 3 files (truncated at depth 2)"
    )
    assert await call(listing, FS.LIST_FILES, path=".", extension=".TS") == (
        ".\nnode_modules\nsrc\n\tF.TS\nsub\n\tnested\na.TS\n\n4 directories, 2 files (truncated at depth 2)"
    )
    assert await call(listing, FS.LIST_FILES, path=".", extension="Ts", maxDepth=3) == (
        ".\nnode_modules\nsrc\nsub\n\tnested\n\t\tdeep\nc.Ts\n\n5 directories, 1 file (truncated at depth 3)"
    )
    # A leading dot is kept as given: "..ts" matches no name here.
    assert await call(listing, FS.LIST_FILES, path=".", extension="..ts") == (
        ".\nnode_modules\nsrc\nsub\n\tnested\n\n4 directories, 0 files (truncated at depth 2)"
    )


@pytest.mark.parametrize("path", [".git", ".git/", "./.git", "sub/.git", "sub/.git/", "nonexist/.git", "/.git"])
async def test_list_files_of_a_git_directory_is_empty(listing: dict[str, WorkspaceTool], path: str) -> None:
    assert await call(listing, FS.LIST_FILES, path=path, showHidden=True) == ".\n\n0 directories, 0 files"


async def test_list_files_exclude_parts_are_trimmed(listing: dict[str, WorkspaceTool]) -> None:
    assert await call(listing, FS.LIST_FILES, path=".", exclude="node_modules | a") == (
        ".\nsrc\n\tF.TS\n\te.ts\nsub\n\tnested\n\ty.txt\nAb\nB\n_u.txt\nb.ts\nc.Ts\nd.tsx\nü.txt\n😀.txt\n～.txt\n\n"
        "3 directories, 12 files (truncated at depth 2)"
    )
    assert await call(listing, FS.LIST_FILES, path=".", exclude=" x |") == (
        ".\nnode_modules\n\tm.js\nsrc\n\tF.TS\n\te.ts\nsub\n\tnested\nAb\nB\nZeta.py\na b c.log\na.TS\nab\n"
        "alpha.py\nb.ts\nc.Ts\n\n4 directories, 12 files (truncated at depth 2)"
    )


# --- .gitignore matches regardless of case -------------------------------------------------

GITIGNORED = {
    "Build/out.js": "x\n", "build2/x.js": "", "src/Main.PY": "x\n", "src/util.py": "", "src/CACHE/c.txt": "",
    "docs/ReadMe.md": "x\n", "docs/notes.MD": "", "Keep.log": "", "drop.LOG": "", "sub/Temp/t.txt": "",
    "tEmP/u.txt": "", "ÉCOLE.txt": "", "école.txt": "", "k.txt": "",
    ".gitignore": "build/\n*.py\n!UTIL.py\ncache\n*.md\n!NOTES.md\n*.log\n!keep.LOG\ntemp/\nécole.txt\n\u212a.txt\n",
}  # fmt: skip


async def test_gitignore_is_case_insensitive(tmp_path: Path) -> None:
    tools = await workspace_tools(tmp_path, GITIGNORED)
    # The Kelvin sign is not folded to an ASCII "k": k.txt stays.
    assert await call(tools, FS.LIST_FILES, path=".", maxDepth=4) == (
        ".\nbuild2\n\tx.js\ndocs\n\tnotes.MD\nsrc\n\tutil.py\nsub\nKeep.log\nk.txt\n\n4 directories, 5 files"
    )
    # Asking for an ignored directory by name, in any case, lists it.
    assert await call(tools, FS.LIST_FILES, path="Build") == ".\nout.js\n\n0 directories, 1 file"
    assert await call(tools, FS.LIST_FILES, path="src/CACHE") == ".\nc.txt\n\n0 directories, 1 file"
    # grep leaves out the same files.
    assert await call(tools, FS.GREP, pattern=".") == "0 matches across 0 files\n---"


async def test_gitignore_inside_a_directory_is_not_the_directory(tmp_path: Path) -> None:
    tools = await workspace_tools(
        tmp_path,
        {"logs/a/b.txt": "", "logs/keep/k.txt": "", "LOGS/other.txt": "", ".gitignore": "logs/**\n!LOGS/keep/\n!logs/Keep/**\n"},
    )
    assert await call(tools, FS.LIST_FILES, path=".", maxDepth=4) == (
        ".\nLOGS\nlogs\n\tkeep\n\t\tk.txt\n\n3 directories, 1 file"
    )


@pytest.mark.parametrize(
    ("rules", "path", "ignored"),
    [
        ("Build/", "build/", True),
        ("*.PY", "x.py", True),
        ("[A-C]*", "apple", True),
        ("ǆ", "ǅ", True),
        ("σ", "ς", True),
        ("ß", "SS", False),
        ("\u212a", "k", False),
        ("K", "\u212a", False),
        # Dotless i upper-cases to an ASCII I, which a non-ASCII character never folds to.
        ("ı", "I", False),
        ("İ", "i", False),
        ("logs/**", "logs/", False),
        ("logs/**  ", "logs/a", True),
        ("foo/**\n!foo/bar/", "foo/bar/", False),
        ("foo/**\n!foo/bar/", "foo/q", True),
    ],
)
def test_gitignore_rules(rules: str, path: str, ignored: bool) -> None:
    spec = gitignore_spec(rules.split("\n"))
    assert spec.match_file(path) is ignored
    assert fold_case("aß\u212aǆ") == "Aß\u212aǄ"


# --- write_file -------------------------------------------------------------------------


async def test_write_file_without_overwrite_on_a_directory(tmp_path: Path) -> None:
    tools = await workspace_tools(tmp_path, {"x.txt": "hi"}, dirs=("d", "e/f"))
    for path in ("d", "./d/", "e/f", ".", "x.txt"):
        with pytest.raises(FileExists, match=f"^File already exists: {path.replace('.', '[.]')}$"):
            await call(tools, FS.WRITE_FILE, path=path, content="a", overwrite=False)
    # Overwriting a directory is still refused as one.
    with pytest.raises(IsDirectory, match=r"^Path is a directory: d$"):
        await call(tools, FS.WRITE_FILE, path="d", content="a")
    assert (tmp_path / "x.txt").read_text() == "hi"


# --- symlinks ---------------------------------------------------------------------------


async def test_a_symlink_reports_the_size_of_what_it_points_to(tmp_path: Path) -> None:
    tools = await workspace_tools(tmp_path, {"target.txt": "0123456789\n"})
    (tmp_path / "link.txt").symlink_to("target.txt")
    stat = await call(tools, FS.FILE_STAT, path="link.txt")
    assert stat.startswith("link.txt Type: file Size: 11 bytes Modified: ")
    assert await call(tools, FS.READ_FILE, path="link.txt") == "link.txt (11 bytes)\n     1→0123456789\n     2→"
    # The link's own size (its target path's length) is what lstat gives; a mount shows that.
    assert (tmp_path / "link.txt").lstat().st_size == len("target.txt")


async def test_mkdir_of_a_dangling_symlink_is_refused(tmp_path: Path) -> None:
    tools = await workspace_tools(tmp_path, {"a.txt": "x"})
    (tmp_path / "dangling").symlink_to("sub/inner")
    for recursive in (True, False):
        with pytest.raises(FileExists, match=r"^File already exists: dangling$"):
            await call(tools, FS.MKDIR, path="dangling", recursive=recursive)
    # Nothing was made where the link points.
    assert not (tmp_path / "sub").exists()
    assert await call(tools, FS.MKDIR, path="sub/inner") == "Created directory sub/inner"
