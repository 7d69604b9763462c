"""Issue 49: every campaign flow with 1 % of its AWS calls failing at random (a throttle or a
lost response, as AWS does under load), for two seeds: no healthy node rebooted, reset,
replaced, quarantined or held (the false-repair figure, ``sim.repair_ledger``), and the
flow's own expectations met. The slow tier (``make test-slow``, ``SLOW_MODULES``): 2 runs of
every flow."""

from __future__ import annotations

import pytest

from local_mode.campaigns.catalog import RUNS
from local_mode.campaigns.runner import calls_failing

RATE = 0.01
SEEDS = (1, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("flow", sorted(RUNS))
def test_a_flow_with_one_percent_of_its_calls_failing_repairs_no_healthy_node(flow: str, seed: int) -> None:
    with calls_failing(RATE, seed):
        result = RUNS[flow](None)
    assert result.failing == (RATE, seed)
    assert result.false_repairs == [], result.broken
    assert result.problems() == [], result.broken
