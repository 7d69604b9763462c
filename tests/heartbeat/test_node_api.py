"""The node API: authorizer, handler (API Gateway proxy events), error mapping, and the
local server end to end with the real node agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_recovery.constants import HB_PK
from gpu_recovery.heartbeat.tokens import (
    hash_token,
    parse_token,
    token_from_authorization,
    verify_against_item,
)
from handlers import node_api, node_authorizer
from handlers._openapi import document_json
from local_mode.server import LocalApi, LocalApiServer
from tests.fixtures.events import load_event
from tests.heartbeat.node_api_calls import api_event, call, ctx, snapshot, tasks_body
from tests.heartbeat.world import NODE, NODE_B, task_arn

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "agent" / "gpu_node_agent.py"


# ------------------------------------------------------------------------ tokens
def test_token_shape_and_hashing() -> None:
    """A token is <node>.<secret>; only its SHA-256 is compared, in constant time."""
    assert parse_token("node-1.abcdefghijklmnopqrstuvwxyz") == ("node-1", "abcdefghijklmnopqrstuvwxyz")
    assert parse_token("no-dot") is None and parse_token("bad node.abcdefghijklmnopq") is None
    assert token_from_authorization("bearer abc") == "abc"
    assert token_from_authorization("Basic abc") is None
    token = "n1.abcdefghijklmnopqrstuvwxyz0123"
    assert verify_against_item(token, {"token_sha256": hash_token(token)}).ok
    assert verify_against_item(token, {"token_sha256": hash_token(token + "x")}).verdict.value == "mismatch"


# -------------------------------------------------------------------- authorizer
def authorize(token: str | None) -> dict[str, Any]:
    event = load_event("apigw_authorizer_token.json")
    event["authorizationToken"] = f"Bearer {token}" if token else ""
    return node_authorizer.lambda_handler(event, ctx("node-authorizer"))


def test_authorizer_good_wrong_revoked_unknown(world) -> None:
    """Given an issued token, Then Allow with node_id in the context, covering both routes;
    a wrong secret -> Deny (403); unknown node, malformed or revoked -> Unauthorized (401)."""
    token = world.tokens.issue(NODE)
    allowed = authorize(token)
    statement = allowed["policyDocument"]["Statement"][0]
    assert statement["Effect"] == "Allow" and allowed["context"] == {"node_id": NODE}
    assert any(r.endswith("/v1/POST/v1/report_gpu") for r in statement["Resource"])
    node, _ = parse_token(token)
    denied = authorize(f"{node}.{'x' * 43}")
    assert denied["policyDocument"]["Statement"][0]["Effect"] == "Deny"
    for bad in (f"{NODE_B}.{'y' * 43}", "garbage", None):
        with pytest.raises(Exception, match=r"^Unauthorized$"):
            authorize(bad)
    assert world.tokens.revoke(NODE)
    with pytest.raises(Exception, match=r"^Unauthorized$"):
        authorize(token)
    item = world.tokens.get(NODE)
    assert "token_sha256" not in item and item["token_status"] == "REVOKED"


def test_admin_cli_issue_list_revoke(world, capsys) -> None:
    """gpu-recovery-admin issue-token prints the token once; list-tokens never shows hashes."""
    from cli.admin import main

    assert main(["issue-token", "--node-id", NODE], store=world.tokens) == 0
    token = capsys.readouterr().out.strip()
    assert world.tokens.verify(token).ok
    assert main(["list-tokens"], store=world.tokens) == 0
    listed = capsys.readouterr().out
    assert NODE in listed and "token_sha256" not in listed and token.split(".")[1] not in listed
    assert main(["revoke-token", "--node-id", NODE], store=world.tokens) == 0
    assert main(["revoke-token", "--node-id", NODE_B], store=world.tokens) == 1
    assert main(["issue-token", "--node-id", "bad id"], store=world.tokens) == 2


# ----------------------------------------------------------------------- handler
def test_report_tasks_event_is_accepted(world) -> None:
    """Given the recorded API Gateway event with a matching authorizer context, Then 200."""
    world.seed_job("j1", world_size=1)
    status, body = call(api_event(world, "apigw_report_tasks.json", tasks_body(world, task_arn("j1", 0))))
    assert status == 200, body
    assert body["refreshed"] == 1 and world.item("j1#0")[HB_PK].startswith("WATCHED#")


def test_report_gpu_event_is_accepted(world) -> None:
    world.seed_job("j1", world_size=1)
    body = json.loads(load_event("apigw_report_gpu.json")["body"])
    body["timestamp"] = world.clock()
    status, out = call(api_event(world, "apigw_report_gpu.json", body))
    assert status == 200, out
    assert world.node_item(NODE)["gpu_telemetry"][0]["util"] == 97


@pytest.mark.parametrize(
    ("body", "status", "code", "hint"),
    [
        ("{not json", 400, "malformed_json", "not valid JSON"),
        ("[1, 2]", 400, "malformed_body", "JSON object"),
        ({"node_id": NODE, "timestamp": "soon", "tasks": []}, 400, "invalid_report", "timestamp"),
        ({"node_id": NODE, "timestamp": 0, "tasks": [{"remote_pid": 1}]}, 400, "invalid_report",
         "task_arn or a running_log_id"),
        ({"node_id": NODE, "tasks": []}, 400, "invalid_report", "timestamp: Field required"),
        ({"node_id": NODE, "timestamp": 1.0, "tasks": [{"task_arn": "not-an-arn"}]}, 400,
         "invalid_report", "tasks.0.task_arn"),
        ("SKEW", 400, "clock_skew", "synchronise"),
        ("OTHER_NODE", 403, "node_mismatch", "not the node"),
        ("MANY_TASKS", 413, "too_many_tasks", "512"),
        ("HUGE", 413, "payload_too_large", "262144"),
    ],
)
def test_bad_reports_are_rejected_and_nothing_is_written(world, body, status, code, hint) -> None:
    """Given a job and a node, When a bad report arrives, Then the status/code/message say
    what to fix and no table item changed."""
    world.seed_job("j1", world_size=1)
    now = world.clock()
    if body == "SKEW":
        body = tasks_body(world, task_arn("j1", 0), ts=now - 301)
    elif body == "OTHER_NODE":
        body = tasks_body(world, task_arn("j1", 0), node=NODE_B)
    elif body == "MANY_TASKS":
        body = tasks_body(world, *[task_arn("j1", 0)] * 513)
    elif body == "HUGE":
        body = {**tasks_body(world), "padding": "x" * (256 * 1024)}
    elif isinstance(body, dict) and isinstance(body.get("timestamp"), float | int) and body["timestamp"] < 10:
        body["timestamp"] = now
    before = snapshot(world)
    got_status, out = call(api_event(world, "apigw_report_tasks.json", body))
    assert (got_status, out["error"]) == (status, code), out
    assert hint in out["message"]
    assert snapshot(world) == before


@pytest.mark.parametrize(("gpu", "field", "hint"), [
    ({"index": 0, "recovery_action": "Reset"}, "gpus.0.recovery_action", "'none', 'gpu_reset'"),
    ({"index": 0, "nvlink_replay_errors": -3}, "gpus.0.nvlink_replay_errors", "greater than or equal to 0"),
    ({"index": 0, "ecc_corrected_volatile": True}, "gpus.0.ecc_corrected_volatile", "not true/false"),
])
def test_a_bad_warning_field_is_a_400_naming_it_and_nothing_is_written(world, gpu, field, hint) -> None:
    """The agent's new fields are checked as its others: nvidia-smi's word instead of the
    health check's name, a negative counter, a boolean count: 400 with the field, nothing written."""
    world.seed_job("j1", world_size=1)
    before = snapshot(world)
    status, out = call(api_event(world, "apigw_report_gpu.json",
                                 {"node_id": NODE, "timestamp": world.clock(), "gpus": [gpu]}))
    assert (status, out["error"], out["field"]) == (400, "invalid_report", field), out
    assert hint in out["message"]
    assert snapshot(world) == before


def test_too_many_gpus_is_413(world) -> None:
    gpus = [{"index": i} for i in range(65)]
    status, out = call(api_event(world, "apigw_report_gpu.json",
                                 {"node_id": NODE, "timestamp": world.clock(), "gpus": gpus}))
    assert status == 413 and out["error"] == "too_many_gpus"


def test_replayed_report_is_409(world) -> None:
    """Given an accepted report, When the same body is posted again, Then 409."""
    world.seed_job("j1", world_size=1)
    body = tasks_body(world, task_arn("j1", 0))
    assert call(api_event(world, "apigw_report_tasks.json", body))[0] == 200
    status, out = call(api_event(world, "apigw_report_tasks.json", body))
    assert status == 409 and out["error"] == "replayed_report"


# ------------------------------------------------------------------ local server
def test_local_api_maps_authorizer_results(world) -> None:
    """Given the local API, Then no header -> 401, wrong secret -> 403, unknown -> 401,
    good token -> 200; unknown routes -> 403 like API Gateway; jobs routes -> jobs handler
    or 404 while it is missing."""
    world.seed_job("j1", world_size=1)
    token = world.tokens.issue(NODE)
    api = LocalApi()
    body = json.dumps(tasks_body(world, task_arn("j1", 0))).encode()
    assert api.handle("POST", "/v1/report_tasks", {}, body).status == 401
    assert api.handle("POST", "/v1/report_tasks", {"Authorization": f"Bearer {NODE}.{'z' * 43}"},
                      body).status == 403
    assert api.handle("POST", "/v1/report_tasks", {"Authorization": f"Bearer {NODE_B}.{'z' * 43}"},
                      body).status == 401
    ok = api.handle("POST", "/prod/v1/report_tasks", {"Authorization": f"Bearer {token}"}, body)
    assert ok.status == 200, ok.body
    assert api.handle("POST", "/v1/nothing", {}, b"").status == 403
    missing = LocalApi(jobs_module="handlers.no_such_jobs_api").handle("GET", "/v1/jobs", {}, b"")
    assert missing.status == 404


def test_local_jobs_route_passes_iam_identity(world) -> None:
    """The jobs route gets requestContext.identity.userArn from X-Local-User."""
    seen: dict[str, Any] = {}
    module = type(sys)("fake_jobs_api")

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        seen.update(event)
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": "{}"}

    module.lambda_handler = handler
    sys.modules["fake_jobs_api"] = module
    try:
        response = LocalApi(jobs_module="fake_jobs_api").handle("GET", "/v1/jobs/abc?x=1",
                                                                {"X-Local-User": "alice"}, b"")
    finally:
        del sys.modules["fake_jobs_api"]
    assert response.status == 200
    assert seen["requestContext"]["identity"]["userArn"] == "arn:aws:iam::123456789012:user/alice"
    assert seen["pathParameters"] == {"proxy": "abc"} and seen["queryStringParameters"] == {"x": "1"}


def test_agent_end_to_end_against_local_server(world, tmp_path) -> None:
    """Given the local server (real authorizer + handler in moto) and a RUNNING rank on the
    node, When the real agent runs --once with a fake nvidia-smi reporting a pending row
    remap and GPU 1's recovery action Reset (the published capture), Then both reports are
    accepted (exit 0), the rank got its heartbeat and the node carries the driver's warning
    (due for the recovery sweep)."""
    from tests.agent.fakes.fake_server import FakeServer, env_without_proxy, fake_kernel_log, fake_nvidia_smi

    world.clock.t = __import__("time").time()  # the agent stamps reports with its real clock
    world.seed_job("j1", world_size=1)
    token = world.tokens.issue(NODE)
    introspection = FakeServer()
    introspection.ecs_tasks = {"Tasks": [{"Arn": task_arn("j1", 0), "KnownStatus": "RUNNING",
                                          "DesiredStatus": "RUNNING"}]}
    introspection.start()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = fake_nvidia_smi(bin_dir, remap_csv="pending_remap.csv",
                          recovery_csv="real/recovery_action_reset_gpu1_dcgm263.csv")
    kcmd, _ = fake_kernel_log(bin_dir)
    try:
        with LocalApiServer() as server:
            env = {**env_without_proxy(), "GPU_AGENT_API_URL": server.url + "/prod",
                   "GPU_AGENT_TOKEN": token, "GPU_AGENT_ECS_INTROSPECTION_URL": introspection.url,
                   "GPU_AGENT_NVIDIA_SMI": str(smi), "GPU_AGENT_XID_COMMAND": str(kcmd),
                   "GPU_AGENT_TASKS_DIR": str(tmp_path / "none"), "GPU_AGENT_PROGRESS_DIR": str(tmp_path),
                   "GPU_AGENT_INTERVAL": "10"}
            proc = subprocess.run([sys.executable, str(AGENT), "--once"], env=env, capture_output=True,
                                  text=True, timeout=60, cwd=str(tmp_path))
    finally:
        introspection.stop()
    assert proc.returncode == 0, proc.stderr
    assert "report_tasks=ok(status=200" in proc.stderr and "report_gpu=ok(status=200" in proc.stderr
    assert world.item("j1#0")[HB_PK].startswith("WATCHED#")
    node = world.node_item(NODE)
    # Both are the same repair (a reset); the earlier rule of equal rank names it.
    assert node["warning"]["rule"] == "gpu-remap-pending" and node["warning"]["action"] == "reset_gpu"
    assert {row.get("ra") for row in node["gpu_telemetry"]} == {"none", "gpu_reset"}
    assert os.environ.get("GPU_AGENT_TOKEN") is None


def test_committed_node_openapi_matches_the_models() -> None:
    """docs/node-api.openapi.json (the fuzz test's schema) is generated from the handler's
    models (regenerate: python -m handlers.node_api --openapi > docs/node-api.openapi.json)."""
    committed = REPO / "docs" / "node-api.openapi.json"
    assert committed.read_text() == document_json(node_api.openapi_document()), \
        "docs/node-api.openapi.json drifted"
    document = json.loads(committed.read_text())
    for route in ("/v1/report_tasks", "/v1/report_gpu"):
        codes = set(document["paths"][route]["post"]["responses"])
        assert codes == {"200", "400", "401", "403", "409", "413", "429"}
    assert node_api.main([]) == 2
