"""domain.relocation.spare_first: when a job leaves its suspect nodes before their DCGM
verdicts (issue 19). Pure."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery.domain.relocation import MAX_NODES_LEFT_BEFORE_VERDICT, SparePool, spare_first


def _decide(**changes: Any) -> Any:
    facts: dict[str, Any] = dict(pool=SparePool(1), relocatable=True, queue_job=False, ranks_ended=True,
                                 pending_verdicts=1, infra_recoveries_left=1, restarts_enforced=True)
    facts.update(changes)
    return spare_first(**facts)


def test_a_relocatable_job_with_a_pool_leaves_its_suspect_nodes_once_its_ranks_ended() -> None:
    assert _decide().go
    assert _decide(pool=SparePool(0, 5.0)).go
    assert _decide(pending_verdicts=MAX_NODES_LEFT_BEFORE_VERDICT).go


@pytest.mark.parametrize(("changes", "why"), [
    ({"pool": SparePool()}, "no spare pool"),
    ({"relocatable": False}, "only relocatable tag-registered jobs"),
    ({"queue_job": True}, "only relocatable tag-registered jobs"),
    ({"restarts_enforced": False}, "restart_job is observed"),
    ({"ranks_ended": False}, "old ranks still running"),
    ({"pending_verdicts": 0}, "no verdict pending"),
    ({"pending_verdicts": MAX_NODES_LEFT_BEFORE_VERDICT + 1}, "waiting for their verdicts"),
    ({"infra_recoveries_left": 0}, "no infrastructure recovery left"),
])
def test_otherwise_the_job_waits_for_the_verdicts_and_says_why(changes: dict[str, Any], why: str) -> None:
    decision = _decide(**changes)
    assert not decision.go
    assert why in decision.why


def test_a_pool_is_configured_by_a_count_or_a_percentage() -> None:
    assert SparePool.parse("2").configured and SparePool.parse("5%").configured
    assert not SparePool.parse("0").configured and not SparePool.parse("0%").configured
