"""Attacks on containment: hostile paths, symlinks and races against the filesystem tools."""

from __future__ import annotations

from ._adversary import Arena, attack

__all__: list[str] = []


@attack(
    "static_path_escapes",
    finding="tool paths that name host files: '..', absolute paths, links pointing out",
    severity="high",
)
async def static_path_escapes(arena: Arena) -> None:
    await arena.open()
    (arena.root / "out").symlink_to(arena.host)
    (arena.root / "secret-link").symlink_to(arena.host / "secret.txt")
    arena.snapshot()
    secret = str(arena.host / "secret.txt")
    for path in ("../host/secret.txt", secret, "out/secret.txt", "secret-link", "./out/../out/secret.txt",
                 f"/..{secret}", "out/tree/a.txt"):
        for tool in ("read_file", "file_stat"):
            out = await arena.tool(tool, path=path)
            arena.check_secret(out, f"{tool} {path}")
            arena.record("host file" not in out, f"{tool} {path} read a host file: {out[:200]}")
        out = await arena.tool("write_file", path=path, content="pwned")
        arena.check_outside(f"write_file {path}")
        out = await arena.tool("delete", path=path, recursive=True)
        arena.check_outside(f"delete {path}")
    out = await arena.tool("grep", pattern="arena-secret|host file", path=".")
    arena.check_secret(out, "grep .")
    arena.record("host file" not in out, f"grep followed a link out: {out[:200]}")
