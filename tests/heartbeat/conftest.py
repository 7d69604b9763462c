"""Fixtures of the heartbeat tests: moto (through local mode's ``LocalAws``), a settable
clock and the world of tests/heartbeat/world.py (jobs seeded straight into the tables, a
node token)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_recovery import clock, runtime
from gpu_recovery.constants import (
    DEFAULT_NODE_TOKEN_TABLE_NAME,
    ENV_HANG_ACTION,
    ENV_HANG_SECONDS,
    ENV_HEARTBEAT_STALE_SECONDS,
    ENV_NODE_LOST_FAIL_SECONDS,
    ENV_NODE_TOKEN_TABLE,
    table_definitions,
)
from local_mode.emulator import LocalAws
from tests.fixtures.clock import ManualClock
from tests.heartbeat.world import T0, World


@pytest.fixture
def clk() -> Iterator[ManualClock]:
    c = ManualClock(T0)
    clock.set_clock(c)
    yield c
    clock.reset_clock()


@pytest.fixture
def local(clk: ManualClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalAws]:
    env = {ENV_NODE_TOKEN_TABLE: DEFAULT_NODE_TOKEN_TABLE_NAME, ENV_HEARTBEAT_STALE_SECONDS: "180",
           ENV_NODE_LOST_FAIL_SECONDS: "1800", ENV_HANG_SECONDS: "0", ENV_HANG_ACTION: "notify"}
    with LocalAws(metrics_disabled=True, extra_env=env) as la:
        la.client("dynamodb").create_table(TableName=DEFAULT_NODE_TOKEN_TABLE_NAME,
                                           BillingMode="PAY_PER_REQUEST",
                                           **table_definitions()["node_token"])
        clock.set_clock(clk)  # LocalAws leaves the clock alone on enter; be explicit
        runtime.reset(clients=False)
        yield la
        runtime.reset(clients=False)


@pytest.fixture
def world(local: LocalAws, clk: ManualClock) -> World:
    return World(local, clk)
