"""Fixtures of the training client's tests: the world of tests/control/world.py, its local
API serving on 127.0.0.1."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_recovery import constants as C
from local_mode.server import LocalApiServer
from tests.control.world import ControlWorld, RecordingApi
from tests.fixtures.queue_cluster import make_queue_cluster


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ControlWorld]:
    """Two 8-GPU nodes, the local API on 127.0.0.1, and the scheduler configured with
    the API's URL (``JOB_CONTROL_API_URL``), so the launcher gives ranks a control channel."""
    from gpu_recovery.queue.jobs_api.triggers import NoSchedulerTrigger
    from handlers import job_control_authorizer, jobs_api

    # Before the emulator: reset() drops the AWS session the emulator's hooks live on.
    jobs_api.reset()
    jobs_api.set_scheduler_trigger(NoSchedulerTrigger())
    try:
        with contextlib.contextmanager(make_queue_cluster)(nodes=[8, 8]) as qc:
            authorizer_calls: list[str] = []

            def counted_authorizer(event: dict[str, Any], context: Any) -> dict[str, Any]:
                authorizer_calls.append(str(event.get("authorizationToken")))
                return job_control_authorizer.lambda_handler(event, context)

            api = RecordingApi(control_authorizer=counted_authorizer)
            with LocalApiServer(api) as server:
                monkeypatch.setenv(C.ENV_CONTROL_API_URL, f"{server.url}/prod")
                world = ControlWorld(qc, server, api, tmp_path, qc.train_td.rsplit("/", 1)[-1],
                                     authorizer_calls)
                qc.local.hooks.on_after_call(
                    "ecs", "StopTask", lambda params, status, parsed, ctx: world.stop_task_calls.append(
                        str(params.get("task"))))
                yield world
    finally:
        jobs_api.reset()
