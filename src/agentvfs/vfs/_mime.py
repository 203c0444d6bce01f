"""MIME types by file extension and the set of extensions that grep treats as text."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["TEXT_EXTENSIONS", "get_mime_type", "is_text_file", "normalize_extensions"]

_MIME: dict[str, str] = {
    # Text and source code.
    "txt": "text/plain", "html": "text/html", "htm": "text/html", "css": "text/css",
    "csv": "text/csv", "md": "text/markdown",
    "js": "application/javascript", "mjs": "application/javascript",
    "ts": "application/typescript", "tsx": "application/typescript", "jsx": "application/javascript",
    "json": "application/json", "xml": "application/xml", "yaml": "text/yaml", "yml": "text/yaml",
    "py": "text/x-python", "rb": "text/x-ruby", "go": "text/x-go", "rs": "text/x-rust",
    "java": "text/x-java", "c": "text/x-c", "cpp": "text/x-c++", "h": "text/x-c", "hpp": "text/x-c++",
    "sh": "text/x-sh", "bash": "text/x-sh", "zsh": "text/x-sh", "toml": "text/toml",
    "ini": "text/plain", "env": "text/plain", "sql": "text/x-sql",
    "graphql": "application/graphql", "gql": "application/graphql",
    "vue": "text/x-vue", "svelte": "text/x-svelte", "scss": "text/x-scss", "sass": "text/x-sass",
    "less": "text/x-less", "php": "application/x-php", "swift": "text/x-swift",
    "kt": "text/x-kotlin", "kts": "text/x-kotlin", "dart": "application/dart", "lua": "text/x-lua",
    "r": "text/x-r", "tf": "text/x-terraform", "tfvars": "text/x-terraform", "mdx": "text/markdown",
    "sas": "text/plain", "log": "text/plain", "jsonl": "application/jsonl",
    # Images.
    "png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
    "svg": "image/svg+xml", "webp": "image/webp", "ico": "image/x-icon", "bmp": "image/bmp",
    "tiff": "image/tiff", "tif": "image/tiff", "heic": "image/heic", "heif": "image/heif",
    "avif": "image/avif",
    "pdf": "application/pdf",
    # Audio and video.
    "mp3": "audio/mpeg", "wav": "audio/wav", "ogg": "audio/ogg", "flac": "audio/flac",
    "m4a": "audio/mp4", "aac": "audio/aac", "mp4": "video/mp4", "webm": "video/webm",
    "mov": "video/quicktime", "avi": "video/x-msvideo", "mkv": "video/x-matroska",
    # Archives, executables and disk images.
    "zip": "application/zip", "tar": "application/x-tar", "gz": "application/gzip",
    "tgz": "application/gzip", "bz2": "application/x-bzip2", "7z": "application/x-7z-compressed",
    "rar": "application/vnd.rar",
    "exe": "application/vnd.microsoft.portable-executable",
    "dll": "application/vnd.microsoft.portable-executable",
    "so": "application/x-sharedlib", "dylib": "application/x-sharedlib",
    "bin": "application/x-binary", "dat": "application/x-binary",
    "dmg": "application/x-apple-diskimage", "iso": "application/x-iso9660-image",
    "deb": "application/vnd.debian.binary-package", "rpm": "application/x-rpm",
    # Office documents.
    "doc": "application/msword",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xls": "application/vnd.ms-excel",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "ppt": "application/vnd.ms-powerpoint",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    # Fonts and compiled code.
    "ttf": "font/ttf", "otf": "font/otf", "woff": "font/woff", "woff2": "font/woff2",
    "wasm": "application/wasm", "class": "application/java-vm", "pyc": "application/x-python-code",
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
