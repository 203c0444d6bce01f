"""``agentvfs cache``: what the content cache holds, and clearing it, from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentvfs.vfs import ContentCache


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentvfs", *args], capture_output=True, text=True, timeout=120)


def test_cache_info_and_clear(tmp_path: Path) -> None:
    missing = _cli("cache", "--cache-dir", str(tmp_path / "none"))
    assert missing.returncode == 0 and "No cache at" in missing.stdout
    cache = ContentCache(tmp_path / "c", max_bytes=1 << 20)
    for i in range(3):
        cache.put(cache.key("s3://h", f"b/{i}", "v"), b"x" * 1000)
    info = _cli("cache", "--cache-dir", str(tmp_path / "c"), "--json")
    assert info.returncode == 0, info.stderr
    figures = json.loads(info.stdout)
    assert figures["entries"] == 3 and figures["bytes"] > 3000
    text = _cli("cache", "--info", "--cache-dir", str(tmp_path / "c"))
    assert "3 entries" in text.stdout
    cleared = _cli("cache", "--clear", "--cache-dir", str(tmp_path / "c"))
    assert cleared.returncode == 0 and "Removed 3 entries" in cleared.stdout
    assert ContentCache(tmp_path / "c").info().entries == 0
    both = _cli("cache", "--info", "--clear")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
