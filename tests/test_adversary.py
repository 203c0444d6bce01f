"""The adversarial suite: every registered attack, each try held (see agentvfs.testing._adversary).

Runs as root and, in CI, again as an unprivileged user (scripts/test.sh). Set
AGENTVFS_ATTACK_SCALE to multiply every attack's iterations.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentvfs.testing import ATTACKS, load_attacks, requirement_missing, run_attack

pytestmark = pytest.mark.anyio

load_attacks()


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_attack_is_held(name: str, tmp_path: Path) -> None:
    attack = ATTACKS[name]
    missing = requirement_missing(attack.requires)
    if missing is not None:
        pytest.skip(f"{name} {missing}")
    report = await run_attack(attack, tmp_path)
    assert report.attempts > 0, f"{name} made no attempt"
    assert report.ok, (
        f"{name} ({attack.severity}): {report.attempts - report.held} of {report.attempts} tries "
        f"were not held: " + "; ".join(report.failures)
    )


def test_every_attack_is_described() -> None:
    assert len(ATTACKS) >= 12
    for attack in ATTACKS.values():
        assert attack.finding and attack.severity in ("critical", "high", "medium", "low")
