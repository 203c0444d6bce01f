"""Attacks from inside the sandbox: privilege, kernel interfaces, processes and secrets."""

from __future__ import annotations

from ._adversary import Arena, attack

__all__: list[str] = []


@attack(
    "bwrap_capabilities",
    finding="a command in the bwrap sandbox keeps root's capabilities",
    severity="critical",
    requires=("bwrap",),
)
async def bwrap_capabilities(arena: Arena) -> None:
    await arena.open(isolation="bwrap")
    out = await arena.sh("grep -E '^Cap(Eff|Prm|Bnd|Amb):' /proc/self/status")
    values = {line.split(":")[0]: line.split(":")[1].strip() for line in out.splitlines() if line.startswith("Cap")}
    for name in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        arena.record(values.get(name) == "0000000000000000", f"{name} is {values.get(name)!r} in: {out!r}")
