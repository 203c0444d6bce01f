"""MIME types by file extension and the set of extensions that grep treats as text."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["TEXT_EXTENSIONS", "get_mime_type", "is_text_file", "normalize_extensions"]

_MIME: dict[str, str] = {
    "txt": "text/plain", "ini": "text/plain", "env": "text/plain", "log": "text/plain",
    "sas": "text/plain", "cfg": "text/plain", "conf": "text/plain",
    "md": "text/markdown", "mdx": "text/markdown", "markdown": "text/markdown",
    "html": "text/html", "htm": "text/html", "css": "text/css", "csv": "text/csv",
    "tsv": "text/tab-separated-values",
    "js": "application/javascript", "mjs": "application/javascript", "cjs": "application/javascript",
    "jsx": "application/javascript", "ts": "application/typescript", "tsx": "application/typescript",
    "json": "application/json", "jsonl": "application/jsonl", "xml": "application/xml",
    "yaml": "text/yaml", "yml": "text/yaml", "py": "text/x-python", "rb": "text/x-ruby",
    "go": "text/x-go", "rs": "text/x-rust", "java": "text/x-java", "c": "text/x-c",
    "h": "text/x-c", "cpp": "text/x-c++", "hpp": "text/x-c++",
    "sh": "text/x-sh", "bash": "text/x-sh", "zsh": "text/x-sh", "toml": "text/toml",
    "sql": "application/sql", "graphql": "application/graphql", "gql": "application/graphql",
    "png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
    "svg": "image/svg+xml", "webp": "image/webp", "ico": "image/x-icon", "bmp": "image/bmp",
    "pdf": "application/pdf", "zip": "application/zip", "gz": "application/gzip",
    "tgz": "application/gzip", "tar": "application/x-tar",
    "bin": "application/x-binary", "dat": "application/x-binary",
    "doc": "application/msword",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xls": "application/vnd.ms-excel",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "ppt": "application/vnd.ms-powerpoint",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "woff": "font/woff", "woff2": "font/woff2", "ttf": "font/ttf", "otf": "font/otf",
    "wasm": "application/wasm", "pyc": "application/x-python-code",
    "mp3": "audio/mpeg", "wav": "audio/wav", "mp4": "video/mp4", "webm": "video/webm",
}  # fmt: skip

TEXT_EXTENSIONS: frozenset[str] = frozenset(
    "." + e
    for e in ["md", "txt", "json", "yaml", "yml", "js", "mjs", "ts", "tsx", "jsx", "py", "rb", "go", "rs", "java", "c", "cpp", "h", "hpp", "sh", "bash", "zsh", "html", "htm", "css", "xml", "toml", "ini", "env", "csv", "sql", "graphql", "gql", "vue", "svg", "mdx", "scss", "sass", "less", "svelte", "php", "swift", "kt", "kts", "dart", "lua", "r", "tf", "tfvars", "sas", "log", "jsonl"]
)


def _extension(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    # A leading dot names a hidden file (".env" has the extension "env", as in Node's
    # path.extname only when something precedes the dot); a name with no dot has none.
    return base[dot + 1 :].lower() if dot > 0 else ""


def get_mime_type(name: str) -> str:
    """Return the MIME type for a file name by extension (``application/octet-stream`` if unknown)."""
    return _MIME.get(_extension(name), "application/octet-stream")


def normalize_extensions(extensions: Iterable[str]) -> frozenset[str]:
    """Lower-case extensions with a leading dot: ``["TS", ".md"]`` -> ``{".ts", ".md"}``."""
    return frozenset(("." + e.lower().lstrip(".")) for e in extensions if e.strip("."))


def is_text_file(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """Tell whether grep should read ``name`` as text (by extension; no extension is not text)."""
    ext = _extension(name)
    return bool(ext) and ("." + ext in TEXT_EXTENSIONS or "." + ext in extra)
