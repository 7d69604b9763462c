"""`make demo` end to end: recovery scenarios + heartbeats + the jobs queue through the local API.

The demo runs once (module scope, simulated time, ~30 s wall) and every test reads
its outcome. The simulation is deterministic: the counts are exact.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from gpu_recovery import constants as C
from tests.fixtures.history import state_changes

EXPECTED_SUMMARY = {
    # 3 recovery jobs + 5 queue jobs
    "jobs": 8,
    # llama-ft, bert-pretrain, gpt-neox, vit-huge, mistral-ft, mixtral-moe
    "completed": 6,
    # llama-ft, bert-pretrain x2 (its node faults again after the reboot), mistral-ft
    "recovered": 4,
    # resnet-sweep
    "failed": 1,
    # node-b, node-d (SSM) x2, mistral-ft's node (EC2), node-e (maintenance reboot)
    "reboots": 5,
    # resnet, bert x2, llama, mistral-ft
    "health_checks": 5,
    # application_error, recovered x4, hung
    "notifications": 6,
}


# The module's scenario is its fixture, run once per worker that takes a test: one
# xdist group (make test runs --dist loadgroup) runs it once. ``long``: its ~75 s are started
# first (tests/conftest.py), not handed out last beside a tier's few remaining tests.
pytestmark = [pytest.mark.xdist_group("demo"), pytest.mark.long]


@pytest.fixture(scope="module")
def demo() -> tuple[dict[str, int], dict[str, Any]]:
    from local_mode import demo as demo_module
    from local_mode import world

    details: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(world, "DEFAULT_DYNAMODB", "moto")  # as `make demo` runs it (tests/conftest.py)
        summary = demo_module.run(quiet=True, details=details)
    return summary, details


def _changes(job: dict[str, Any]) -> list[Any]:
    return state_changes(job.get("history", []))


def _states(job: dict[str, Any]) -> list[str]:
    return [str(h.get("to")) for h in _changes(job)]


def _queue_job(details: dict[str, Any], name: str) -> dict[str, Any]:
    return details["jobs"][details["queue"][name]]


def test_summary_fields_and_counts(demo: tuple[dict[str, int], dict[str, Any]]) -> None:
    summary, _ = demo
    assert list(summary) == ["jobs", "completed", "recovered", "failed", "reboots",
                             "health_checks", "notifications"]
    assert summary == EXPECTED_SUMMARY


def test_recovery_scenarios_unchanged(demo: tuple[dict[str, int], dict[str, Any]]) -> None:
    _, details = demo
    jobs = details["jobs"]
    assert jobs["llama-ft"]["job_state"] == "COMPLETE"
    assert jobs["llama-ft"]["recoveries_used"] == 1
    # The flapping node is rebooted again; the job is charged once for it (fault catalog
    # escalation: a node rebooted twice for one cause is replaced on its 3rd fault).
    assert jobs["bert-pretrain"]["job_state"] == "COMPLETE"
    assert (jobs["bert-pretrain"]["attempt"], jobs["bert-pretrain"]["recoveries_used"]) == (3, 1)
    assert jobs["resnet-sweep"]["job_state"] == "FAILED"
    assert "healthy" in jobs["resnet-sweep"]["last_error"]


def test_silent_node_makes_the_job_node_lost_then_running(
        demo: tuple[dict[str, int], dict[str, Any]]) -> None:
    _, details = demo
    job = _queue_job(details, "gpt-neox")
    states = _states(job)
    lost = states.index("NODE_LOST")
    assert states[lost + 1] == "RUNNING"
    entries = _changes(job)
    assert "no heartbeat" in entries[lost]["reason"]
    assert entries[lost + 1]["reason"].startswith("heartbeat again")
    # stale after 180 s without a report (silent from 14:20:00; sweep every minute)
    assert 180 <= entries[lost]["at"] - (details["t0"] + 20 * 60) <= 240
    assert job["job_state"] == "COMPLETE"


def test_hung_rank_is_reported_and_notified(demo: tuple[dict[str, int], dict[str, Any]]) -> None:
    _, details = demo
    job = _queue_job(details, "vit-huge")
    states = _states(job)
    hung = states.index("HUNG")
    assert states[hung + 1] == "RUNNING"  # the step advances again
    assert job["job_state"] == "COMPLETE"
    notes = [n for n in details["notifications"]
             if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == C.NotificationKind.HUNG.value]
    assert len(notes) == 1
    assert details["queue"]["vit-huge"] in notes[0]["subject"]


def test_waiting_job_goes_through_pending_resources_before_it_starts(
        demo: tuple[dict[str, int], dict[str, Any]]) -> None:
    _, details = demo
    job = _queue_job(details, "mixtral-moe")
    states = _states(job)
    assert states[0] == "QUEUED"
    pending = states.index("PENDING_RESOURCES")
    assert "STARTING" in states[pending + 1:]
    assert states[-2:] == ["RUNNING", "COMPLETE"]
    # it waited for gpt-neox (one of the two concurrent jobs) to end
    neox_done = next(h["at"] for h in _queue_job(details, "gpt-neox")["history"] if h["to"] == "COMPLETE")
    first_start = next(h["at"] for h in job["history"] if h["to"] == "STARTING")
    assert first_start > neox_done


def test_concurrent_jobs_and_queue_outcomes(demo: tuple[dict[str, int], dict[str, Any]]) -> None:
    _, details = demo
    neox, vit = _queue_job(details, "gpt-neox"), _queue_job(details, "vit-huge")
    running = [next(h["at"] for h in j["history"] if h["to"] == "RUNNING") for j in (neox, vit)]
    ended = [next(h["at"] for h in j["history"] if h["to"] == "COMPLETE") for j in (neox, vit)]
    assert max(running) < min(ended)  # both ran at the same time
    assert _queue_job(details, "bloom-sweep")["job_state"] == "CANCELED"
    assert "STARTING" not in _states(_queue_job(details, "bloom-sweep"))
    mistral = _queue_job(details, "mistral-ft")
    assert mistral["job_state"] == "COMPLETE"
    assert mistral["recoveries_used"] == 1
    assert {"PENDING_HEALTHCHECK", "PENDING_RESTART"} <= set(_states(mistral))
    listed = {j["name"]: j["state"] for j in details["listed"]}
    assert listed == {"gpt-neox": "COMPLETE", "vit-huge": "COMPLETE", "mistral-ft": "COMPLETE",
                      "mixtral-moe": "COMPLETE", "bloom-sweep": "CANCELED"}


def test_nothing_failed_on_the_side(demo: tuple[dict[str, int], dict[str, Any]]) -> None:
    _, details = demo
    assert details["dead_letters"] == []
    assert details["trigger_failures"] == []
    assert details["api_errors"] == []
    assert details["agent_rejections"] == []
    assert details["agent_reports"] > 1000  # 10 nodes, every 30 s, ~90 min


def test_local_server_serves_jobs_and_rejects_an_unauthenticated_report() -> None:
    from handlers import jobs_api
    from local_mode.server import LocalApi, LocalApiServer
    from local_mode.world import build_world

    jobs_api.reset()
    try:
        with build_world(handlers=False) as world, LocalApiServer(LocalApi()) as server:
            sim = world.ecs
            node = sim.add_node("node-a")
            request = urllib.request.Request(  # noqa: S310 (loopback http)
                server.url + "/v1/jobs", headers={"X-Local-User": "t"})
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (loopback)
                assert response.status == 200
                assert json.loads(response.read()) == {"jobs": [], "next_token": None}
            body = json.dumps({"node_id": node.container_instance_id, "timestamp": sim.now(),
                               "tasks": []}).encode()
            report = urllib.request.Request(  # noqa: S310 (loopback http)
                server.url + "/v1/report_tasks", data=body, method="POST",
                headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as denied:
                urllib.request.urlopen(report, timeout=30)  # noqa: S310 (loopback)
            assert denied.value.code == 401
    finally:
        jobs_api.reset()
