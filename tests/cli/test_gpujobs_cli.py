"""``gpujobs`` CLI: every subcommand against a fake jobs API on 127.0.0.1, plus SigV4 signing.

The fake API (``FakeApi``) is a ``ThreadingHTTPServer`` on an ephemeral port implementing
the REST contract with an in-memory job store; it records every request and can be told to
fail the next requests (503, 429...) or to walk a job through a script of states. Waiting
is replaced (``gpujobs.clock.sleep``), so nothing here sleeps for real. SigV4 is tested offline:
the signer with fixed credentials and time, and the request the client prepares for an API
Gateway endpoint (never connected to).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.credentials import Credentials

from cli import gpujobs
from cli.gpujobs import clock as gpujobs_clock
from cli.gpujobs.watch import colored

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SPEC = REPO / "examples" / "job.yaml"
API_GW = "https://abc123.execute-api.us-east-1.amazonaws.com/v1"
TERMINAL = {"COMPLETE", "FAILED", "USER_STOPPED", "CANCELED"}


# --------------------------------------------------------------------------- fake API


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: Any


@dataclass
class FakeApi:
    """In-memory implementation of the jobs REST contract."""

    endpoint: str = ""
    requests: list[Recorded] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    idempotency: dict[str, str] = field(default_factory=dict)
    failures: list[tuple[str, str, int, bytes]] = field(default_factory=list)
    state_scripts: dict[str, list[Any]] = field(default_factory=dict)  # a state, or fields to update
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    logs_visible: dict[str, int] = field(default_factory=dict)
    logs_null_token_when_caught_up: bool = False
    #: GET .../logs calls (1-based) answered with an empty page whose token moves on, as the
    #: jobs API answers while CloudWatch Logs pages empty (end_of_stream false)
    logs_empty_calls: set[int] = field(default_factory=set)
    logs_calls: int = 0
    page_size: int = 50
    quota_rows: list[dict[str, Any]] = field(default_factory=list)  # GET /v1/quotas?all=true, 2 a page
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- test helpers

    def fail_next(self, method: str, path: str, status: int, body: bytes | None = None) -> None:
        payload = body if body is not None else json.dumps({"message": f"injected {status}"}).encode()
        self.failures.append((method, path, status, payload))

    def add_job(self, job_id: str, state: str = "QUEUED", user: str = "alice",
                **extra: Any) -> dict[str, Any]:
        spec = {"name": job_id.rsplit("-", 1)[0], "task_definition": "llama-train:3", "nnodes": 2,
                "gpus_per_node": 8, "priority": "HIGH", "max_recovery_attempts": 3,
                "overrides": {"command": ["torchrun", "train.py"], "environment": {}}, "labels": {}}
        job = {"job_id": job_id, "name": spec["name"], "state": state, "user": user, "priority": 30,
               "priority_name": "HIGH", "nnodes": 2, "gpus_per_node": 8,
               "submitted_at": 1_763_000_000 + len(self.jobs), "spec": spec, "attempt": 0,
               "ranks": [], "attempts": [], "last_error": ""}
        job.update(extra)
        self.jobs[job_id] = job
        return job

    def calls(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        return [r for r in self.requests
                if (method is None or r.method == method) and (path is None or r.path == path)]

    # -- request handling

    def handle(self, req: BaseHTTPRequestHandler) -> tuple[int, Any]:
        parts = urllib.parse.urlsplit(req.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items()}
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        with self.lock:
            self.requests.append(Recorded(req.command, parts.path, query,
                                          {k.lower(): v for k, v in req.headers.items()}, body))
            for i, (method, path, status, payload) in enumerate(self.failures):
                if method == req.command and path == parts.path:
                    del self.failures[i]
                    return status, payload
            return self.route(req.command, parts.path.split("/")[1:], query, body,
                              {k.lower(): v for k, v in req.headers.items()})

    def route(self, method: str, segs: list[str], query: dict[str, str], body: Any,
              headers: dict[str, str]) -> tuple[int, Any]:
        if segs == ["v1", "quotas"] and method == "GET":
            return self.quotas(query, headers)
        if segs[:2] != ["v1", "jobs"]:
            return 404, {"message": "no such route"}
        rest = segs[2:]
        if method == "POST" and not rest:
            return self.submit(body or {}, headers)
        if method == "GET" and not rest:
            return self.list(query)
        job = self.jobs.get(urllib.parse.unquote(rest[0])) if rest else None
        if job is None:
            return 404, {"message": f"job {rest[0] if rest else ''} not found"}
        if method == "GET" and len(rest) == 1:
            script = self.state_scripts.get(job["job_id"])
            if script:
                step = script.pop(0)
                if isinstance(step, dict) and "new_events" in step:  # history grows with the state
                    step = dict(step)
                    self.events.setdefault(job["job_id"], []).extend(step.pop("new_events"))
                job.update(step if isinstance(step, dict) else {"state": step})
                self.update_ranks(job)
                jid = job["job_id"]
                if jid in self.logs_visible:  # training makes progress between polls
                    self.logs_visible[jid] = min(self.logs_visible[jid] + 1, len(self.logs[jid]))
            return 200, job
        if method == "POST" and rest[1:] == ["cancel"]:
            if job["state"] in gpujobs.TERMINAL_STATES:  # as the API: a job that ended is unchanged
                return 200, {"job_id": job["job_id"], "state": job["state"], "previous_state": job["state"],
                             "changed": False}
            job["state"] = "CANCELING"
            return 200, {"job_id": job["job_id"], "state": "CANCELING", "previous_state": "RUNNING",
                         "changed": True}
        if method == "POST" and rest[1:] in (["suspend"], ["resume"]):
            return self.suspend_or_resume(job, rest[1])
        if method == "GET" and rest[1:] == ["events"]:
            return 200, {"events": self.events.get(job["job_id"], [])}
        if method == "GET" and rest[1:] == ["logs"]:
            return self.log_page(job["job_id"], query)
        return 405, {"message": "method not allowed"}

    def suspend_or_resume(self, job: dict[str, Any], action: str) -> tuple[int, Any]:
        """The service's outcomes: RUNNING -> SUSPENDING (with a deadline), waiting -> SUSPENDED
        held; resume of a held SUSPENDED job: queued again; anything else: 409."""
        state, out = job["state"], {"job_id": job["job_id"], "previous_state": job["state"]}
        if action == "suspend" and state == "RUNNING":
            job.update(state="SUSPENDING",
                       suspend={"kind": "user", "hold": True, "deadline_at": 1_763_650_060})
            return 200, {**out, "state": "SUSPENDING", "changed": True, "held": True,
                         "deadline_at": 1_763_650_060}
        if action == "suspend" and state in ("QUEUED", "SUSPENDED"):
            changed = not job.get("held")
            job.update(state="SUSPENDED", held=True)
            return 200, {**out, "state": "SUSPENDED", "changed": changed, "held": True}
        if action == "resume" and state == "SUSPENDED":
            changed = bool(job.get("held"))
            job["held"] = False
            return 200, {**out, "state": "SUSPENDED", "changed": changed, "held": False}
        verb = "suspended" if action == "suspend" else "resumed"
        return 409, {"error": "conflict", "message": f"job {job['job_id']} is {state}: it can be {verb} "
                                                     "once RUNNING (or while it waits)"}

    def quotas(self, query: dict[str, str], headers: dict[str, str]) -> tuple[int, Any]:
        caller = headers.get("x-local-user", "?")
        if (query.get("all") or query.get("user", caller) != caller) and caller != "admin":
            return 403, {"error": "forbidden:admin",
                         "message": "admin: only an admin role (admin) may read the quota of "
                                    f"{query.get('user', 'every user')}"}
        if query.get("all") == "true":
            start = int(query.get("next_token") or 0)
            more = start + 2 < len(self.quota_rows)
            return 200, {"quotas": self.quota_rows[start:start + 2],
                         "next_token": str(start + 2) if more else None}
        levels = [("EXTREME_HIGH", 50, None, "unlimited", 0), ("VERY_HIGH", 40, None, "unlimited", 0),
                  ("HIGH", 30, 8, "default", 2), ("ABOVE_NORMAL", 20, None, "unlimited", 0),
                  ("NORMAL", 10, 4, "set", 4), ("BELOW_NORMAL", 5, None, "unlimited", 0),
                  ("LOW", 0, 0, "set", 0)]
        return 200, {"user": query.get("user", caller), "quotas": [
            {"priority": value, "priority_name": name, "max_nodes": limit, "source": source,
             "used_nodes": used, "room": None if limit is None else max(0, limit - used)}
            for name, value, limit, source, used in levels]}

    def submit(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        for key in ("name", "task_definition"):
            if not body.get(key):
                return 400, {"message": f"{key} is required", "field": key}
        if int(body.get("nnodes", 1)) < 1:
            return 400, {"message": "nnodes must be at least 1", "field": "nnodes"}
        key = headers.get("idempotency-key")
        if key and key in self.idempotency:
            return 201, self.jobs[self.idempotency[key]]
        job_id = f"{body['name']}-20261120-143201-{len(self.jobs):04x}"
        job = self.add_job(job_id, state="QUEUED", user=headers.get("x-local-user", "?"))
        job["spec"] = body
        if key:
            self.idempotency[key] = job_id
        return 201, job

    def list(self, query: dict[str, str]) -> tuple[int, Any]:
        jobs = sorted(self.jobs.values(), key=lambda j: j["submitted_at"], reverse=True)
        jobs = [j for j in jobs if (not query.get("state") or j["state"] == query["state"])
                and (not query.get("user") or j["user"] == query["user"])]
        start = int(query.get("next_token") or 0)
        limit = int(query.get("limit") or self.page_size)
        page = jobs[start:start + limit]
        more = start + limit < len(jobs)
        summaries = [{k: v for k, v in j.items() if k not in ("spec", "ranks", "attempts")} for j in page]
        return 200, {"jobs": summaries, "next_token": str(start + limit) if more else None}

    def log_page(self, job_id: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if self.jobs[job_id]["state"] == "QUEUED":  # as the API answers a job not started
            return 404, {"error": "not_found", "message": f"job {job_id} has not started yet: no logs"}
        stream = self.logs.get(job_id, [])
        visible = self.logs_visible.get(job_id, len(stream))
        start = int(str(query.get("next_token") or 0).split("~")[0])
        self.logs_calls += 1
        if self.logs_calls in self.logs_empty_calls:
            return 200, {"events": [], "next_token": f"{start}~{self.logs_calls}", "end_of_stream": False}
        page = stream[start:visible][:3]
        end = start + len(page)
        token: str | None = str(end)
        if self.logs_null_token_when_caught_up and end >= visible:
            token = None
        return 200, {"events": page, "next_token": token}

    @staticmethod
    def update_ranks(job: dict[str, Any]) -> None:
        running = job["state"] == "RUNNING"
        if job["state"] in ("STARTING", "RUNNING"):
            job["attempt"] = max(job["attempt"], 1)
            job["ranks"] = [{"rank": r, "state": "RUNNING" if running else "PENDING",
                             "task_arn": f"arn:aws:ecs:us-east-1:123456789012:task/gpu/{r:032x}",
                             "container_instance": f"ci-{r}", "last_heartbeat_at": 1_763_000_100}
                            for r in range(2)]


def _make_handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            status, payload = api.handle(self)
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _serve
        do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    fake.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Replace the CLI's waits (retry backoff, polling) with a recorder."""
    calls: list[float] = []
    monkeypatch.setattr(gpujobs_clock, "sleep", calls.append)
    return calls


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "alice")
    monkeypatch.delenv("GPUJOBS_ENDPOINT", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


def run(api: FakeApi, *argv: str) -> int:
    return gpujobs.main(["--endpoint", api.endpoint, *argv])


# --------------------------------------------------------------------------- submit


def test_submit_from_yaml_sends_the_spec_with_an_idempotency_key(api, sleeps, capsys):
    """Given examples/job.yaml,
    when `gpujobs submit -f examples/job.yaml` runs against a local endpoint,
    then one POST /v1/jobs carries the JobSpec (2 x 8 GPUs, torchrun command, env as strings),
    a UUID Idempotency-Key, X-Local-User=$USER and no Authorization; the job id is printed."""
    assert run(api, "submit", "-f", str(EXAMPLE_SPEC)) == 0

    (post,) = api.calls("POST", "/v1/jobs")
    spec = yaml.safe_load(EXAMPLE_SPEC.read_text())
    assert post.body["name"] == spec["name"] == "llama-ft"
    assert post.body["task_definition"] == "llama-train:3"
    assert (post.body["nnodes"], post.body["gpus_per_node"]) == (2, 8)
    assert post.body["priority"] == "HIGH"
    assert post.body["overrides"]["command"][0] == "bash"
    assert "torchrun" in post.body["overrides"]["command"][-1]
    assert all(isinstance(v, str) for v in post.body["overrides"]["environment"].values())
    assert post.body["labels"] == {"team": "nlp", "project": "llama-ft"}
    assert uuid.UUID(post.headers["idempotency-key"]).version == 4
    assert post.headers["content-type"] == "application/json"
    assert post.headers["x-local-user"] == "alice"
    assert "authorization" not in post.headers
    out = capsys.readouterr().out.strip()
    assert out == next(iter(api.jobs)) and out.startswith("llama-ft-")


def test_example_spec_is_valid_for_the_server_model():
    """Given examples/job.yaml,
    when the server's JobSpec model (if present) validates it,
    then it is accepted: 2 nodes x 8 GPUs on llama-train:3."""
    models = pytest.importorskip("gpu_recovery.queue.models")
    spec = models.JobSpec.model_validate(yaml.safe_load(EXAMPLE_SPEC.read_text()))
    assert (spec.nnodes, spec.gpus_per_node, spec.task_definition) == (2, 8, "llama-train:3")


def test_submit_from_flags_builds_the_body(api, sleeps, capsys):
    """Given only flags (a single shell-quoted --command, repeated --env and --label),
    when submit runs,
    then the body has the split command, the env and label maps, an upper-cased priority and
    the explicit idempotency key."""
    rc = run(api, "submit", "--name", "bert", "--task-definition", "bert-train:7", "--nnodes", "4",
             "--gpus-per-node", "8", "--priority", "above-normal",
             "--command", "torchrun --nproc-per-node 8 train.py --lr '1e-4 warm'",
             "--env", "NCCL_DEBUG=INFO", "--env", "EPOCHS=3", "--label", "team=nlp",
             "--max-recovery-attempts", "2", "--idempotency-key", "key-123")
    assert rc == 0
    (post,) = api.calls("POST", "/v1/jobs")
    assert post.body == {
        "name": "bert", "task_definition": "bert-train:7", "nnodes": 4, "gpus_per_node": 8,
        "priority": "ABOVE_NORMAL", "max_recovery_attempts": 2, "labels": {"team": "nlp"},
        "overrides": {"command": ["torchrun", "--nproc-per-node", "8", "train.py", "--lr", "1e-4 warm"],
                      "environment": {"NCCL_DEBUG": "INFO", "EPOCHS": "3"}},
    }
    assert post.headers["idempotency-key"] == "key-123"
    assert capsys.readouterr().out.strip().startswith("bert-")


def test_submit_repeated_command_flags_and_flags_override_the_file(api, sleeps, tmp_path):
    """Given a JSON spec file and flags that override name, priority and command,
    when submit runs,
    then the flags win, repeated --command flags are kept one argument each, and a numeric
    priority stays a number."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"name": "a", "task_definition": "t:1", "nnodes": 1, "gpus_per_node": 1,
                                     "overrides": {"command": ["python", "old.py"],
                                                   "environment": {"X": 1}}}))
    rc = run(api, "submit", "-f", str(spec_file), "--name", "b", "--priority", "30",
             "--command", "python", "--command", "new.py", "--command=--flag")
    assert rc == 0
    (post,) = api.calls("POST", "/v1/jobs")
    assert post.body["name"] == "b"
    assert post.body["priority"] == 30
    assert post.body["overrides"] == {"command": ["python", "new.py", "--flag"], "environment": {"X": "1"}}


def test_submit_retries_a_503_with_the_same_idempotency_key(api, sleeps, capsys):
    """Given the API answers the first POST /v1/jobs with 503,
    when submit runs,
    then the CLI backs off, retries once with the same Idempotency-Key (and the same body),
    exactly one job exists and its id is printed."""
    api.fail_next("POST", "/v1/jobs", 503)
    assert run(api, "submit", "--name", "x", "--task-definition", "t:1", "--nnodes", "1",
               "--gpus-per-node", "1") == 0
    first, second = api.calls("POST", "/v1/jobs")
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
    assert first.body == second.body
    assert len(api.jobs) == 1 and len(sleeps) == 1
    assert capsys.readouterr().out.strip() == next(iter(api.jobs))


def test_submit_retries_429_then_gives_up_after_three_tries_on_5xx(api, sleeps, capsys):
    """Given a 429 then three 500s,
    when two submits run,
    then the first succeeds on its second try; the second fails after 3 tries with exit 3
    and the server's message on stderr, without a traceback."""
    api.fail_next("POST", "/v1/jobs", 429)
    assert run(api, "submit", "--name", "x", "--task-definition", "t:1") == 0
    for _ in range(3):
        api.fail_next("POST", "/v1/jobs", 500, json.dumps({"message": "boom"}).encode())
    api.requests.clear()
    assert run(api, "submit", "--name", "y", "--task-definition", "t:1") == 3
    assert len(api.calls("POST", "/v1/jobs")) == 3
    err = capsys.readouterr().err
    assert "HTTP 500: boom" in err and "Traceback" not in err


def test_submit_without_a_name_fails_locally(api, sleeps, capsys):
    """Given no --name and no spec file,
    when submit runs,
    then nothing is sent, exit code 2, and stderr names the missing field."""
    assert run(api, "submit", "--task-definition", "t:1") == 2
    assert api.requests == []
    assert "missing name" in capsys.readouterr().err


def test_submit_4xx_prints_message_and_field(api, sleeps, capsys):
    """Given the server rejects the spec with 400 {"message", "field"},
    when submit runs,
    then exit code 2, stderr shows the message and the field, no retry, no traceback."""
    assert run(api, "submit", "--name", "x", "--task-definition", "t:1", "--nnodes", "1",
               "--max-recovery-attempts", "1") == 0
    api.fail_next("POST", "/v1/jobs", 400,
                  json.dumps({"message": "nnodes must be at least 1", "field": "nnodes"}).encode())
    api.requests.clear()
    assert run(api, "submit", "--name", "x", "--task-definition", "t:1", "--nnodes", "1") == 2
    assert len(api.requests) == 1 and sleeps == []
    err = capsys.readouterr().err
    assert "nnodes must be at least 1" in err and "field: nnodes" in err and "Traceback" not in err


# --------------------------------------------------------------------------- list / show / cancel / events


def test_list_all_follows_next_token(api, sleeps, capsys):
    """Given 5 jobs and a page size of 2,
    when `list --limit 2 --all` runs,
    then 3 pages are fetched (following next_token) and the table shows all 5, newest first."""
    for i in range(5):
        api.add_job(f"job{i}-20261120-143201-000{i}", state="RUNNING" if i % 2 else "QUEUED")
    assert run(api, "list", "--limit", "2", "--all") == 0
    gets = api.calls("GET", "/v1/jobs")
    assert [g.query.get("next_token") for g in gets] == [None, "2", "4"]
    assert all(g.query["limit"] == "2" for g in gets)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:3] == ["JOB", "ID", "NAME"]
    expected = [f"job{i}-20261120-143201-000{i}" for i in range(4, -1, -1)]
    assert [line.split()[0] for line in lines[1:]] == expected
    assert "HIGH" in lines[1]


def test_list_one_page_hints_at_more_and_passes_filters(api, sleeps, capsys):
    """Given 3 jobs of alice and a page size of 2,
    when `list --state running --user alice --limit 2` runs (no --all),
    then one request carries the filters (state upper-cased) and, when more pages exist,
    stderr hints at --next-token; --json prints the jobs and the token."""
    for i in range(3):
        api.add_job(f"j{i}-x", state="RUNNING")
    assert run(api, "list", "--state", "running", "--user", "alice", "--limit", "2") == 0
    (get,) = api.calls("GET", "/v1/jobs")
    assert get.query == {"state": "RUNNING", "user": "alice", "limit": "2"}
    captured = capsys.readouterr()
    assert "--next-token 2" in captured.err
    assert run(api, "--json", "list", "--limit", "2") == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["jobs"]) == 2 and doc["next_token"] == "2"


def test_show_prints_summary_ranks_and_attempts(api, sleeps, capsys):
    """Given a running job with 2 ranks and one failed and one current attempt,
    when `show ID` runs,
    then the summary shows state, priority, nodes, ranks and attempts; `show ID --json` prints
    the server's document unchanged."""
    api.add_job(
        "llama-ft-20261120-143201-7f3a", state="RUNNING", attempt=2, recoveries_used=1,
        max_recovery_attempts=3, last_error="rank 1: Xid 79 on node-b",
        ranks=[{"rank": r, "state": "RUNNING", "task_arn": f"arn:aws:ecs:us-east-1:1:task/gpu/task{r}",
                "container_instance": f"arn:aws:ecs:us-east-1:1:container-instance/gpu/ci{r}",
                "last_heartbeat_at": "2026-11-20T15:00:00Z", "extra_field": True} for r in range(2)],
        attempts=[{"attempt": 1, "started_at": "2026-11-20T14:33:00Z", "ended_at": "2026-11-20T14:50:00Z",
                   "outcome": "FAILED", "failure_kind": "GPU_XID", "reason": "Xid 79"},
                  {"attempt": 2, "started_at": "2026-11-20T14:55:00Z", "ended_at": None}],
    )
    assert run(api, "show", "llama-ft-20261120-143201-7f3a") == 0
    out = capsys.readouterr().out
    assert "llama-ft-20261120-143201-7f3a" in out
    assert "RUNNING" in out and "HIGH (30)" in out and "2x8 GPUs" in out
    assert "2/2 running" in out and "1/3 used" in out and "Xid 79 on node-b" in out
    assert "task0" in out and "ci1" in out and "2026-11-20T15:00:00Z" in out
    assert "GPU_XID" in out and "2026-11-20T14:55:00Z" in out
    assert run(api, "show", "llama-ft-20261120-143201-7f3a", "--json") == 0
    assert json.loads(capsys.readouterr().out) == api.jobs["llama-ft-20261120-143201-7f3a"]


def test_show_of_a_large_job_says_which_ranks_it_shows_and_asks_for_the_next_page(api, sleeps, capsys):
    """Given a 250-rank job whose answer holds ranks 100-199 (ranks_next 200) and 240 live ranks,
    when `show ID --ranks-from 100` runs, then it asks for that page, shows those ranks, says
    which they are and how to ask for the next, and counts the job's live ranks, not the page's."""
    api.add_job(
        "big-1", state="RUNNING", nnodes=250, ranks_next=200, ranks_live=240,
        ranks=[{"rank": r, "state": "RUNNING", "task_arn": f"arn:aws:ecs:us-east-1:1:task/gpu/task{r}",
                "container_instance_id": f"ci{r}"} for r in range(100, 200)],
    )
    assert run(api, "show", "big-1", "--ranks-from", "100") == 0
    out = capsys.readouterr().out
    [call] = api.calls("GET", "/v1/jobs/big-1")
    assert call.query == {"ranks_from": "100"}
    assert "task100" in out and "task199" in out
    assert "ranks 100-199 of 250: --ranks-from 200 for the next" in out
    assert "240/250 started, not ended" in out and "/250 running" not in out


def test_show_unknown_job_is_a_404(api, sleeps, capsys):
    """Given no such job,
    when `show nope` runs,
    then exit code 2 and the server's message on stderr, no traceback, no retry."""
    assert run(api, "show", "nope") == 2
    err = capsys.readouterr().err
    assert "HTTP 404: job nope not found" in err and "Traceback" not in err
    assert len(api.requests) == 1


def test_cancel_posts_and_prints_the_state(api, sleeps, capsys):
    """Given a running job,
    when `cancel ID` runs,
    then POST /v1/jobs/ID/cancel is sent and "ID: CANCELING" printed."""
    api.add_job("j-1", state="RUNNING")
    assert run(api, "cancel", "j-1") == 0
    assert len(api.calls("POST", "/v1/jobs/j-1/cancel")) == 1
    assert capsys.readouterr().out.strip() == "j-1: CANCELING"


def test_cancel_of_a_job_that_completed_is_an_error_saying_so(api, sleeps, capsys):
    """Given a COMPLETE job (the API answers a cancel unchanged), When `cancel ID` runs, Then
    it exits 2 with one line saying the job already ended (nothing was canceled); a repeat on
    a CANCELED job is no error: it already was."""
    api.add_job("j-1", state="COMPLETE")
    assert run(api, "cancel", "j-1") == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "gpujobs: error: j-1 already ended COMPLETE: nothing to cancel\n")
    api.add_job("j-2", state="CANCELED")
    assert run(api, "cancel", "j-2") == 0
    assert capsys.readouterr().out == "j-2: CANCELED (it already was)\n"


@pytest.mark.parametrize(("change", "refused"), [
    ({"nnode": 2}, "nnode: is not a known field (did you mean nnodes?) (field: nnode)"),
    ({"nnodes": 0}, "nnodes: must be >= 1 (field: nnodes)"),
    ({"gpus_per_node": 17}, "gpus_per_node: must be <= 16 (field: gpus_per_node)"),
    ({"overrides": {"environment": {"1BAD": "x"}}},
     "overrides.environment.0.name: has an invalid format (field: overrides.environment.0.name)"),
])
def test_dry_run_refuses_what_the_api_would_in_its_words(api, sleeps, capsys, tmp_path, change, refused):
    """Given a spec file the API would refuse, When `submit --dry-run` runs, Then it exits 2
    with the API's own message (the same validation: gpu_recovery.queue.spec_errors), prints
    no spec and sends nothing."""
    doc = {**yaml.safe_load(EXAMPLE_SPEC.read_text()), **change}
    if "nnode" in change:
        doc.pop("nnodes")
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    assert run(api, "submit", "-f", str(spec_file), "--dry-run") == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"gpujobs: error: the API would refuse this spec: {refused}\n"
    assert api.requests == []
    assert run(api, "submit", "-f", str(EXAMPLE_SPEC), "--dry-run") == 0
    assert json.loads(capsys.readouterr().out)["name"] == "llama-ft"


def test_events_prints_a_table(api, sleeps, capsys):
    """Given a job with two transitions,
    when `events ID` runs,
    then each transition is one line with from, to, actor and reason."""
    api.add_job("j-1", state="RUNNING")
    api.events["j-1"] = [
        {"at": "2026-11-20T14:32:01Z", "from": None, "to": "QUEUED", "reason": "submitted", "actor": "alice"},
        {"at": 1_763_649_200, "from": "QUEUED", "to": "STARTING", "reason": "capacity ok",
         "actor": "scheduler"},
    ]
    assert run(api, "events", "j-1") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["AT", "FROM", "TO", "ACTOR", "REASON"]
    assert lines[1].split()[1:4] == ["-", "QUEUED", "alice"]
    assert lines[2].split()[1:4] == ["QUEUED", "STARTING", "scheduler"] and "capacity ok" in lines[2]
    assert lines[2].startswith("2025-")  # epoch seconds rendered as ISO


# --------------------------------------------------------------------------- logs


@pytest.mark.parametrize("null_token", [False, True], ids=["token-always", "null-token-when-caught-up"])
def test_logs_follow_stops_once_terminal_and_drained(api, sleeps, capsys, null_token):
    """Given a running job whose logs grow by one line per state poll and that completes on
    the third poll,
    when `logs ID --follow` runs,
    then every line is printed once, in order (including the line written after the job
    ended), polls wait 2 s, and the command exits 0 after the job is terminal and drained."""
    api.add_job("j-1", state="RUNNING")
    api.state_scripts["j-1"] = ["RUNNING", "RUNNING", "COMPLETE"]
    api.logs["j-1"] = [{"timestamp": 1_763_649_200_000 + i, "message": f"step {i}"} for i in range(6)]
    api.logs_visible["j-1"] = 3
    api.logs_null_token_when_caught_up = null_token
    assert run(api, "logs", "j-1", "--follow", "--rank", "1", "--attempt", "2") == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 1)[1] for line in out] == [f"step {i}" for i in range(6)]
    assert out[0].startswith("2025-11-20T")
    assert sleeps and set(sleeps) == {2.0}
    assert len(api.calls("GET", "/v1/jobs/j-1")) == 3
    logs_calls = api.calls("GET", "/v1/jobs/j-1/logs")
    assert all(c.query["rank"] == "1" and c.query["attempt"] == "2" for c in logs_calls)


def test_logs_without_follow_reads_past_an_empty_page_whose_token_moved_on(api, sleeps, capsys):
    """Given 5 log lines served 3 per page, the first and third answers empty pages whose
    token moved on (CloudWatch Logs pages empty while more events exist; the API says
    end_of_stream false),
    when `logs ID` runs (no --follow),
    then every line is printed, in order, and nothing was waited for."""
    api.add_job("j-1", state="COMPLETE")
    api.logs["j-1"] = [{"timestamp": i, "message": f"m{i}"} for i in range(5)]
    api.logs_empty_calls = {1, 3}
    assert run(api, "logs", "j-1", "--json") == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["message"] for e in out] == [f"m{i}" for i in range(5)]
    assert sleeps == []


def test_logs_follow_waits_for_a_job_that_has_not_started(api, sleeps, capsys):
    """Given a job just submitted (the API: "has not started yet: no logs"), When `logs ID
    --follow` runs, Then it waits for the job to start and prints its lines (without
    --follow the 404 is an error, exit 2)."""
    api.add_job("j-1", state="QUEUED")
    api.state_scripts["j-1"] = ["QUEUED", "RUNNING", "COMPLETE"]
    api.logs["j-1"] = [{"timestamp": 1_763_649_200_000, "message": "step 1"}]
    assert run(api, "logs", "j-1") == 2
    assert "has not started yet" in capsys.readouterr().err
    assert run(api, "logs", "j-1", "--follow") == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(" step 1")


def test_logs_without_follow_drains_available_pages(api, sleeps, capsys):
    """Given 5 log lines served 3 per page,
    when `logs ID --json` runs (no --follow),
    then both pages are fetched, 5 JSON lines printed, and the job state never polled."""
    api.add_job("j-1", state="COMPLETE")
    api.logs["j-1"] = [{"timestamp": i, "message": f"m{i}"} for i in range(5)]
    assert run(api, "logs", "j-1", "--json") == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["message"] for e in out] == [f"m{i}" for i in range(5)]
    assert api.calls("GET", "/v1/jobs/j-1") == [] and sleeps == []


# --------------------------------------------------------------------------- watch


@pytest.mark.parametrize(("final", "code"), [("COMPLETE", 0), ("FAILED", 1), ("USER_STOPPED", 1),
                                              ("CANCELED", 1)])
def test_watch_non_tty_prints_one_line_per_state_change(api, sleeps, capsys, final, code):
    """Given a job that goes QUEUED, STARTING, RUNNING, RUNNING, then a terminal state,
    when `watch ID --interval 3` runs with stdout not a TTY,
    then one plain line per change is printed (no ANSI codes) and the exit code is 0 for
    COMPLETE, 1 for FAILED / USER_STOPPED / CANCELED."""
    api.add_job("j-1", state="QUEUED")
    api.state_scripts["j-1"] = ["QUEUED", "STARTING", "RUNNING", "RUNNING", final]
    assert run(api, "watch", "j-1", "--interval", "3") == code
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert "j-1" in lines[0] and "QUEUED" in lines[0]
    assert "QUEUED -> STARTING" in lines[1]
    assert "STARTING -> RUNNING" in lines[2] and "ranks=2/2" in lines[2] and "attempt=1" in lines[2]
    assert f"RUNNING -> {final}" in lines[3]
    assert "\x1b" not in "".join(lines)
    assert sleeps == [3.0] * 4


def test_watch_tty_redraws_in_place(api, sleeps, monkeypatch):
    """Given stdout is a TTY and a job that starts and completes,
    when `watch ID` runs,
    then the live line is redrawn with carriage return + erase-line ANSI codes and shows the
    state, attempt, a ranks bar and elapsed time; the cursor is restored; exit 0."""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr("sys.stdout", tty)
    api.add_job("j-1", state="QUEUED")
    api.state_scripts["j-1"] = ["STARTING", "RUNNING", "COMPLETE"]
    assert run(api, "watch", "j-1") == 0
    out = tty.getvalue()
    assert out.startswith("\x1b[?25l") and out.endswith("\x1b[?25h")
    assert out.count("\r\x1b[2K") == 3
    assert "ranks [####################] 2/2 running" in out
    assert "attempt 1" in out and "elapsed " in out and "RUNNING -> COMPLETE" in out


def test_watch_of_a_large_job_says_its_bar_counts_ranks_started_not_running(api, sleeps, monkeypatch):
    """Given a 250-rank job whose answer holds a page of its ranks and counts 240 live ranks
    (started and not ended: some may still be starting), when `watch ID` runs on a TTY, then the
    bar counts those 240 and says what they are, not that they run."""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr("sys.stdout", tty)
    api.add_job("big-1", state="RUNNING", nnodes=250, ranks_next=100, ranks_live=240,
                ranks=[{"rank": r, "state": "PENDING"} for r in range(100)])
    api.state_scripts["big-1"] = ["COMPLETE"]
    assert run(api, "watch", "big-1") == 0
    out = tty.getvalue()
    assert "ranks [###################.] 240/250 started, not ended" in out
    assert "/250 running" not in out


def test_watch_shows_why_each_transition_happened(api, sleeps, capsys):
    """Given a running job recovered after an XID (the history says why at each step),
    when `watch ID` runs (not a TTY),
    then each change line is followed by the transitions since the last poll with their
    reasons, intermediate states included (PENDING_HEALTHCHECK lasted less than a poll)."""
    api.add_job("j-1", state="RUNNING", attempt=1)
    at = 1_763_650_000
    api.events["j-1"] = [{"at": at - 60, "from": "", "to": "QUEUED", "reason": "submitted"},
                         {"at": at - 55, "from": "QUEUED", "to": "RUNNING", "reason": "rank 0 running"}]
    api.state_scripts["j-1"] = [
        "RUNNING",
        {"state": "PENDING_RESTART", "new_events": [
            {"at": at, "to": "PENDING_HEALTHCHECK", "reason": "rank 1 exited 1: XID 79 -> reboot"},
            {"at": at, "to": "PENDING_RESTART", "reason": "verdict REBOOT (rule xid-79)"}]},
        {"state": "RUNNING", "attempt": 2, "new_events": [
            {"at": at + 180, "to": "STARTING", "reason": "gang restart, attempt 2"},
            {"at": at + 185, "to": "RUNNING", "reason": "rank 0 running"}]},
        {"state": "COMPLETE",
         "new_events": [{"at": at + 900, "to": "COMPLETE", "reason": "every rank exited 0"}]},
    ]
    assert run(api, "watch", "j-1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:3] == ["    14:45:40 QUEUED: submitted", "    14:45:45 RUNNING: rank 0 running"]
    assert "RUNNING -> PENDING_RESTART" in lines[3]
    assert lines[4:6] == ["    14:46:40 PENDING_HEALTHCHECK: rank 1 exited 1: XID 79 -> reboot",
                          "    14:46:40 PENDING_RESTART: verdict REBOOT (rule xid-79)"]
    assert "PENDING_RESTART -> RUNNING" in lines[6] and "attempt=2" in lines[6]
    assert lines[7:9] == ["    14:49:40 STARTING: gang restart, attempt 2",
                          "    14:49:45 RUNNING: rank 0 running"]
    assert "RUNNING -> COMPLETE" in lines[9] and lines[10] == "    15:01:40 COMPLETE: every rank exited 0"
    assert len(lines) == 11


def test_times_are_on_the_api_clock(monkeypatch):
    """Given an API whose Date header is an hour ahead of this machine (the local
    playground's clock runs fast), the client's notion of now follows it; a difference
    within the header's one-second rounding is no skew."""
    client = gpujobs.ApiClient("http://127.0.0.1:1")
    monkeypatch.setattr(gpujobs_clock, "utcnow", lambda: datetime(2026, 11, 20, 14, 0, 0, tzinfo=UTC))
    client._note_server_time("Fri, 20 Nov 2026 15:00:00 GMT")
    assert client.server_now() == datetime(2026, 11, 20, 15, 0, 0, tzinfo=UTC)
    client._note_server_time("not a date")  # ignored: the last known offset stays
    assert client.clock_offset == 3600
    client._note_server_time("Fri, 20 Nov 2026 14:00:01 GMT")
    assert client.clock_offset == 0.0


def test_watch_tolerates_a_transient_outage(api, sleeps, capsys):
    """Given the API fails every try of one poll with 503,
    when watch runs,
    then a warning is printed, watching continues and ends with the job's outcome."""
    api.add_job("j-1", state="RUNNING")
    api.state_scripts["j-1"] = ["RUNNING", "FAILED"]
    for _ in range(3):
        api.fail_next("GET", "/v1/jobs/j-1", 503)
    assert run(api, "watch", "j-1") == 1
    captured = capsys.readouterr()
    assert "warning" in captured.err and "503" in captured.err
    assert "RUNNING -> FAILED" in captured.out


# --------------------------------------------------------------------------- errors and config


def test_network_error_exits_3(sleeps, capsys):
    """Given nothing listens on the endpoint's port,
    when `show ID` runs,
    then 3 tries are made and the command exits 3 with a one-line message."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert gpujobs.main(["--endpoint", f"http://127.0.0.1:{port}", "show", "x"]) == 3
    err = capsys.readouterr().err
    assert "cannot reach" in err and "Traceback" not in err
    assert len(sleeps) == 2


def test_non_json_5xx_and_missing_endpoint(api, sleeps, capsys):
    """Given a 502 with an HTML body on every try, and separately no endpoint configured,
    when commands run,
    then the first exits 3 with the body shown; the second exits 2 naming GPUJOBS_ENDPOINT."""
    api.add_job("j-1")
    for _ in range(3):
        api.fail_next("GET", "/v1/jobs/j-1", 502, b"<html>Bad Gateway</html>")
    assert run(api, "show", "j-1") == 3
    assert "Bad Gateway" in capsys.readouterr().err
    assert gpujobs.main(["list"]) == 2
    assert "GPUJOBS_ENDPOINT" in capsys.readouterr().err


def test_endpoint_from_env_and_usage_errors(api, sleeps, monkeypatch, capsys):
    """Given GPUJOBS_ENDPOINT set,
    when `list` runs without --endpoint, and then with an unknown subcommand,
    then the env endpoint is used; the usage error returns 2 instead of raising SystemExit."""
    monkeypatch.setenv("GPUJOBS_ENDPOINT", api.endpoint + "/v1/")
    assert gpujobs.main(["list"]) == 0
    assert api.calls("GET", "/v1/jobs")
    assert gpujobs.main(["frobnicate"]) == 2
    assert gpujobs.main(["--help"]) == 0


# --------------------------------------------------------------------------- SigV4


def _independent_sigv4(method: str, url: str, headers: dict[str, str], body: bytes, amz_date: str,
                       region: str, secret: str) -> tuple[str, str]:
    """SigV4 from the AWS spec, without botocore: (signed headers, signature)."""
    parts = urllib.parse.urlsplit(url)
    hdrs = {k.lower(): " ".join(v.split()) for k, v in headers.items()}
    hdrs["host"] = parts.netloc
    signed = ";".join(sorted(hdrs))
    canonical_headers = "".join(f"{k}:{hdrs[k]}\n" for k in sorted(hdrs))
    query = "&".join(sorted(parts.query.split("&"))) if parts.query else ""
    canonical = "\n".join([method, parts.path, query, canonical_headers, signed,
                           hashlib.sha256(body).hexdigest()])
    scope = f"{amz_date[:8]}/{region}/execute-api/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (amz_date[:8], region, "execute-api", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return signed, hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def test_sign_request_with_fixed_credentials_and_time():
    """Given Credentials('AKID', 'SECRET'), 2026-11-20T14:32:01Z and a POST with a JSON body
    and an Idempotency-Key,
    when sign_request runs,
    then Authorization is AWS4-HMAC-SHA256 with Credential=AKID/20261120/us-east-1/execute-api/
    aws4_request, the signed headers include host, x-amz-date, x-amz-content-sha256 (the body
    hash) and idempotency-key, and the signature matches an independent SigV4 computation."""
    url = f"{API_GW}/jobs?limit=2&state=RUNNING"
    body = b'{"name":"llama-ft","nnodes":2}'
    base = {"Content-Type": "application/json", "Idempotency-Key": "key-1"}
    now = datetime(2026, 11, 20, 14, 32, 1, tzinfo=UTC)
    creds = Credentials("AKID", "SECRET")
    headers = gpujobs.sign_request("POST", url, base, body, creds, "us-east-1", now=now)

    auth = headers["Authorization"]
    assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKID/20261120/us-east-1/execute-api/aws4_request, ")
    assert headers["X-Amz-Date"] == "20261120T143201Z"
    assert headers["X-Amz-Content-SHA256"] == hashlib.sha256(body).hexdigest()
    assert headers["Idempotency-Key"] == "key-1"
    signed_headers = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
    assert {"host", "x-amz-date", "x-amz-content-sha256", "idempotency-key", "content-type"} <= set(
        signed_headers)
    expected_signed, expected_sig = _independent_sigv4(
        "POST", url, {k: v for k, v in headers.items() if k != "Authorization"}, body,
        "20261120T143201Z", "us-east-1", "SECRET")
    assert ";".join(signed_headers) == expected_signed
    assert auth.endswith(f"Signature={expected_sig}")

    other = gpujobs.sign_request("POST", url, base, body + b" ", Credentials("AKID", "SECRET"), "us-east-1",
                                 now=now)
    assert other["Authorization"] != auth  # the body is part of the signature


def test_client_signs_api_gateway_requests_and_not_local_ones():
    """Given an API Gateway endpoint with fixed credentials (session token included), and a
    local endpoint,
    when the client prepares requests (nothing is sent),
    then the AWS one targets /v1/jobs (stage not doubled), is signed for the region in the
    host with the idempotency key and token signed, and has no X-Local-User; the local one is
    unsigned and carries X-Local-User."""
    assert gpujobs.needs_sigv4(API_GW) and not gpujobs.needs_sigv4("http://127.0.0.1:8080")
    assert gpujobs.region_from_url(API_GW) == "us-east-1"

    client = gpujobs.ApiClient(API_GW, credentials=Credentials("AKID", "SECRET", "TOKEN"))
    req = client.prepare("POST", "/jobs", body={"name": "x"}, headers={"Idempotency-Key": "k"})
    assert req.full_url == f"{API_GW}/jobs"
    hdrs = {k.lower(): v for k, v in req.header_items()}
    assert hdrs["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKID/")
    assert "/us-east-1/execute-api/aws4_request" in hdrs["authorization"]
    signed = hdrs["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    assert {"host", "x-amz-date", "idempotency-key", "x-amz-security-token"} <= set(signed)
    assert hdrs["x-amz-security-token"] == "TOKEN"
    assert "x-local-user" not in hdrs

    eu = gpujobs.ApiClient("https://abc.execute-api.us-east-1.amazonaws.com", region="eu-west-1",
                           credentials=Credentials("AKID", "SECRET"))
    get = eu.prepare("GET", "/jobs/j-1")
    assert get.full_url == "https://abc.execute-api.us-east-1.amazonaws.com/v1/jobs/j-1"
    assert "/eu-west-1/execute-api/" in dict(get.header_items())["Authorization"]

    local = gpujobs.ApiClient("http://127.0.0.1:8080", local_user="bob")
    req = local.prepare("GET", "/jobs", query={"limit": 5, "next_token": "a b/c"})
    assert req.full_url == "http://127.0.0.1:8080/v1/jobs?limit=5&next_token=a%20b%2Fc"
    hdrs = {k.lower(): v for k, v in req.header_items()}
    assert "authorization" not in hdrs and hdrs["x-local-user"] == "bob"


def test_main_signs_with_env_credentials_end_to_end(monkeypatch, sleeps, capsys):
    """Given GPUJOBS_ENDPOINT on API Gateway, credentials in the environment and urlopen
    replaced (nothing leaves the process),
    when `submit` runs,
    then the request handed to urlopen is signed (Idempotency-Key among the signed headers)
    and the job id from the canned 201 answer is printed."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SECRETENV")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("GPUJOBS_ENDPOINT", API_GW)
    sent: list[Any] = []

    class Response(io.BytesIO):
        status = 201

    def fake_urlopen(req: Any, timeout: float) -> Response:
        sent.append(req)
        return Response(json.dumps({"job_id": "x-20261120-143201-0001", "state": "QUEUED"}).encode())

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    assert gpujobs.main(["submit", "--name", "x", "--task-definition", "t:1"]) == 0
    assert capsys.readouterr().out.strip() == "x-20261120-143201-0001"
    (req,) = sent
    auth = dict(req.header_items())["Authorization"]
    assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDENV/")
    assert "idempotency-key" in auth.split("SignedHeaders=")[1]
    assert req.full_url == f"{API_GW}/jobs" and json.loads(req.data)["name"] == "x"


# --------------------------------------------------------------------------- time sharing


def test_submit_accepts_auto_priority_and_a_suspend_grace(api, sleeps, tmp_path, capsys):
    """Given `--priority auto --suspend-grace 120` flags, and a spec file with `priority: AUTO` and
    `suspend_grace_seconds: "90"`,
    when submit runs,
    then the body carries priority "AUTO" (the server resolves it) and the grace as an integer;
    a priority that is neither a level nor AUTO fails locally naming AUTO among the choices."""
    assert run(api, "submit", "--name", "a", "--task-definition", "t:1", "--priority", "auto",
               "--suspend-grace", "120") == 0
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("name: b\ntask_definition: t:1\npriority: AUTO\nsuspend_grace_seconds: '90'\n")
    assert run(api, "submit", "-f", str(spec_file)) == 0
    first, second = api.calls("POST", "/v1/jobs")
    assert (first.body["priority"], first.body["suspend_grace_seconds"]) == ("AUTO", 120)
    assert (second.body["priority"], second.body["suspend_grace_seconds"]) == ("AUTO", 90)
    capsys.readouterr()
    assert run(api, "submit", "--name", "c", "--task-definition", "t:1", "--priority", "urgent") == 2
    err = capsys.readouterr().err
    assert "invalid priority 'urgent'" in err and "AUTO" in err and "field: priority" in err
    assert run(api, "submit", "--name", "c", "--task-definition", "t:1", "--suspend-grace", "0") == 2
    assert "--suspend-grace" in capsys.readouterr().err
    assert len(api.calls("POST", "/v1/jobs")) == 2


def test_suspend_a_running_job_prints_the_deadline_and_the_hold(api, sleeps, capsys):
    """Given a RUNNING job,
    when `suspend ID` runs,
    then POST /v1/jobs/ID/suspend is sent once and one line says SUSPENDING, the forced-stop
    deadline and how to resume; `--json` prints the API's answer unchanged."""
    api.add_job("j-1", state="RUNNING")
    assert run(api, "suspend", "j-1") == 0
    assert len(api.calls("POST", "/v1/jobs/j-1/suspend")) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith("j-1: SUSPENDING (")
    assert "go_suspend()" in out and "2025-11-20T14:47:40Z at the latest" in out
    assert "held until `gpujobs resume j-1`" in out
    api.add_job("j-2", state="QUEUED")
    assert run(api, "suspend", "j-2", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"job_id": "j-2", "previous_state": "QUEUED",
                                                   "state": "SUSPENDED", "changed": True, "held": True}


def test_suspend_again_and_resume_say_what_happens(api, sleeps, capsys):
    """Given a held SUSPENDED job,
    when it is suspended again, resumed, and resumed again,
    then the repeat says it already was, the resume says it is queued at its original position."""
    api.add_job("j-1", state="SUSPENDED", held=True)
    assert run(api, "suspend", "j-1") == 0
    assert capsys.readouterr().out.strip() == (
        "j-1: SUSPENDED (held until `gpujobs resume j-1`; it already was)")
    assert run(api, "resume", "j-1") == 0
    assert capsys.readouterr().out.strip() == (
        "j-1: SUSPENDED (queued at its original position: it starts when nodes are free)")
    assert run(api, "resume", "j-1") == 0
    assert capsys.readouterr().out.strip().endswith("; it already was)")


@pytest.mark.parametrize("action", ["suspend", "resume"])
def test_suspend_or_resume_refused_is_a_4xx_with_the_reason(api, sleeps, capsys, action):
    """Given a COMPLETE job (and no job at all),
    when `suspend|resume ID` runs,
    then the 409 exits 2 (like every 4xx, not retried) with the server's reason on stderr; an
    unknown job exits 2 with the 404."""
    api.add_job("j-1", state="COMPLETE")
    assert run(api, action, "j-1") == 2
    err = capsys.readouterr().err
    verb = {"suspend": "suspended", "resume": "resumed"}[action]
    assert err.startswith(f"gpujobs: error: HTTP 409: job j-1 is COMPLETE: it can be {verb}")
    assert "Traceback" not in err and sleeps == []
    assert run(api, action, "nope") == 2
    assert "HTTP 404" in capsys.readouterr().err


def test_quota_prints_every_level(api, sleeps, capsys):
    """Given the API's quota view of alice,
    when `quota` runs,
    then GET /v1/quotas (no parameters) is sent and a table shows every level, high to low,
    with "unlimited" where no limit applies and the room left; `--json` prints the view."""
    assert run(api, "quota") == 0
    (get,) = api.calls("GET", "/v1/quotas")
    assert get.query == {}
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "User: alice"
    assert lines[1].split() == ["PRIORITY", "LIMIT", "SOURCE", "IN", "USE", "ROOM"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert list(rows) == ["EXTREME_HIGH", "VERY_HIGH", "HIGH", "ABOVE_NORMAL", "NORMAL", "BELOW_NORMAL",
                          "LOW"]
    assert rows["HIGH"] == ["8", "default", "2", "6"]
    assert rows["NORMAL"] == ["4", "set", "4", "0"]
    assert rows["VERY_HIGH"] == ["unlimited", "unlimited", "0", "-"]
    assert rows["LOW"] == ["0", "set", "0", "0"]
    assert run(api, "--json", "quota") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["user"] == "alice" and len(doc["quotas"]) == 7


def test_quota_of_another_user_is_refused_for_a_non_admin(api, sleeps, capsys, monkeypatch):
    """Given alice (not an admin),
    when she asks for bob's quota or every quota,
    then the 403 exits 2 and stderr says only an admin may; `--user` and `--all` together are a
    usage error. An admin gets bob's view (user= sent)."""
    assert run(api, "quota", "--user", "bob") == 2
    err = capsys.readouterr().err
    assert "gpujobs: error: HTTP 403: admin: only an admin role (admin) may read the quota of bob" in err
    assert run(api, "quota", "--all") == 2
    assert "HTTP 403" in capsys.readouterr().err
    assert run(api, "quota", "--all", "--user", "bob") == 2
    assert "not allowed with argument" in capsys.readouterr().err
    monkeypatch.setenv("USER", "admin")
    assert run(api, "quota", "--user", "bob") == 0
    assert api.calls("GET", "/v1/quotas")[-1].query == {"user": "bob"}
    assert capsys.readouterr().out.splitlines()[0] == "User: bob"


def test_quota_all_follows_every_page(api, sleeps, capsys, monkeypatch):
    """Given an admin and five stored quota rows served two a page,
    when `quota --all` runs,
    then three pages are fetched (all=true, then next_token) and one table shows the five rows."""
    monkeypatch.setenv("USER", "admin")
    api.quota_rows = [{"user": f"u{i}", "priority": 30, "priority_name": "HIGH", "max_nodes": i,
                       "source": "set", "used_nodes": 0, "room": i} for i in range(5)]
    assert run(api, "quota", "--all") == 0
    gets = api.calls("GET", "/v1/quotas")
    assert [g.query for g in gets] == [{"all": "true"}, {"all": "true", "next_token": "2"},
                                       {"all": "true", "next_token": "4"}]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["USER", "PRIORITY", "LIMIT"]
    assert [line.split()[0] for line in lines[1:]] == ["u0", "u1", "u2", "u3", "u4"]


def test_show_prints_the_time_sharing_fields(api, sleeps, capsys):
    """Given a held SUSPENDED job submitted with AUTO, suspended twice (resumed once), now
    waiting for its quota,
    when `show ID` runs,
    then the state says held, the wait reason, the quota user, how the priority was chosen,
    the counts and the suspension (kind, who, reason, held) are shown; the deadline of a
    suspension that is over is not."""
    api.add_job("j-1", state="SUSPENDED", held=True, wait_reason="quota: HIGH 8/8 nodes in use",
                quota_user="alice", priority_requested="AUTO", demoted_from=None, suspend_count=2,
                resume_count=1, suspend={"kind": "user", "reason": "suspended by alice",
                                         "requested_at": 1_763_650_000, "deadline_at": 1_763_650_060,
                                         "grace_seconds": 60, "hold": True, "by_user": "alice", "by_job": ""})
    assert run(api, "show", "j-1") == 0
    out = capsys.readouterr().out
    assert "State:      SUSPENDED, held until resumed" in out
    assert "Waiting:    quota: HIGH 8/8 nodes in use" in out
    assert "Quota user: alice" in out
    assert "Priority:   HIGH (30), chosen by AUTO at submit" in out
    assert "Suspended:  2 time(s), resumed 1" in out
    assert "\nSuspension:\n" in out
    assert "  Kind:      user (by user alice)" in out and "  Reason:    suspended by alice" in out
    assert "  Requested: 2025-11-20T14:46:40Z" in out
    assert "  Deadline:  2025-11-20T14:47:40Z (grace 60 s)" in out
    assert "  Held:      yes: waits for `gpujobs resume j-1`" in out


def test_show_a_preempted_then_resumed_and_demoted_job(api, sleeps, capsys):
    """Given a RUNNING job demoted from ABOVE_NORMAL that was preempted once by bob's job,
    when `show ID` runs,
    then the priority says it was demoted and the block is the last suspension, naming the
    job that caused it, without deadline or hold; a job never suspended has no such lines."""
    api.add_job("j-1", state="RUNNING", priority=10, priority_name="NORMAL", demoted_from=20,
                suspend_count=1, resume_count=1,
                suspend={"kind": "preempted", "reason": "preempted by job big-1 (HIGH)", "by_job": "big-1",
                         "by_user": "bob", "deadline_at": 1_763_650_060, "grace_seconds": 60, "hold": False,
                         "stop_requested_at": 1_763_650_010, "stop_reason": "go_suspend() by rank 0"})
    assert run(api, "show", "j-1") == 0
    out = capsys.readouterr().out
    assert "Priority:   NORMAL (10), demoted from ABOVE_NORMAL (20)" in out
    assert "\nLast suspension:\n" in out
    assert "  Kind:      preempted (by job big-1, user bob)" in out
    assert "  Stopped:   2025-11-20T14:46:50Z: go_suspend() by rank 0" in out
    assert "Deadline" not in out and "Held" not in out
    api.add_job("j-2", state="RUNNING")
    assert run(api, "show", "j-2") == 0
    out = capsys.readouterr().out
    assert "uspen" not in out and "Waiting" not in out and "AUTO" not in out


def test_list_shows_suspending_and_suspended_jobs(api, sleeps, capsys):
    """Given jobs SUSPENDING and SUSPENDED,
    when `list` and `list --state suspended` run,
    then their states are in the table and the filter is sent upper-cased."""
    api.add_job("j-1", state="SUSPENDING")
    api.add_job("j-2", state="SUSPENDED")
    assert run(api, "list") == 0
    rows = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows == {"j-1": "SUSPENDING", "j-2": "SUSPENDED"}
    assert run(api, "list", "--state", "suspended") == 0
    assert api.calls("GET", "/v1/jobs")[-1].query["state"] == "SUSPENDED"
    assert capsys.readouterr().out.splitlines()[1].split()[0] == "j-2"


def test_watch_follows_a_suspension_and_the_resume(api, sleeps, capsys):
    """Given a running job suspended by its user, held, resumed, started again and completed,
    when `watch ID` runs (not a TTY),
    then each step is one line: SUSPENDING with its kind and deadline, SUSPENDED (held), the
    resume as (held) -> SUSPENDED, then STARTING at attempt 2; exit 0."""
    api.add_job("j-1", state="RUNNING", attempt=1)
    suspend = {"kind": "user", "hold": True, "deadline_at": 1_763_650_060}
    api.state_scripts["j-1"] = [
        "RUNNING", {"state": "SUSPENDING", "suspend": suspend}, {"state": "SUSPENDED", "held": True},
        {"state": "SUSPENDED", "held": False}, {"state": "STARTING", "attempt": 2}, "COMPLETE"]
    assert run(api, "watch", "j-1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6
    assert "RUNNING -> SUSPENDING" in lines[1] and "suspend=user" in lines[1]
    assert "deadline=2025-11-20T14:47:40Z" in lines[1]
    assert "SUSPENDING -> SUSPENDED (held)" in lines[2]
    assert "SUSPENDED (held) -> SUSPENDED  " in lines[3]
    assert "SUSPENDED -> STARTING" in lines[4] and "attempt=2" in lines[4]
    assert "STARTING -> COMPLETE" in lines[5]


def test_watch_colors_time_sharing_states():
    """SUSPENDING is cyan and SUSPENDED (held or not) blue: paused, not failed nor waiting."""
    assert colored("SUSPENDING", True) == "\x1b[1;36mSUSPENDING\x1b[0m"
    assert colored("SUSPENDED (held)", True) == "\x1b[1;34mSUSPENDED (held)\x1b[0m"
    assert colored("QUEUED", True) == "\x1b[1;33mQUEUED\x1b[0m"
    assert colored("SUSPENDED", False) == "SUSPENDED"


def test_the_cli_knows_every_job_state_of_the_server():
    """Every server job state is either terminal or non-terminal for the CLI (list filters, watch)."""
    states = pytest.importorskip("gpu_recovery.domain.states")
    server = {s.value for s in states.JobState}
    assert server == set(gpujobs.NON_TERMINAL_STATES) | set(gpujobs.TERMINAL_STATES)
    assert {s.value for s in states.TERMINAL_JOB_STATES} == set(gpujobs.TERMINAL_STATES)


def test_watch_gives_up_after_its_timeout_with_exit_124(api, monkeypatch, capsys):
    """Given a job that stays RUNNING and a clock that advances only when the CLI waits,
    when `watch ID --interval 5 --timeout 12` runs,
    then it polls at 0, 5 and 10 s, gives up at the 15 s poll with exit 124 and says on
    stderr that the job is still RUNNING; the global --timeout stays the HTTP timeout."""
    clock = [0.0]
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(gpujobs_clock, "sleep", wait)
    monkeypatch.setattr(gpujobs_clock, "monotonic", lambda: clock[0])
    api.add_job("j-1", state="RUNNING")
    assert run(api, "--timeout", "7", "watch", "j-1", "--interval", "5", "--timeout", "12") == 124
    assert waits == [5.0, 5.0, 5.0]
    assert len(api.calls("GET", "/v1/jobs/j-1")) == 4
    err = capsys.readouterr().err
    assert "j-1 is still RUNNING after 12 s (--timeout)" in err
    args = gpujobs.build_parser().parse_args(["--timeout", "7", "watch", "j-1", "--timeout", "12"])
    assert (args.timeout, args.watch_timeout) == (7.0, 12.0)


def test_watch_without_timeout_waits_until_the_job_ends(api, sleeps):
    """Given no --timeout, when the job ends after many polls, then watch exits on its state."""
    api.add_job("j-1", state="RUNNING")
    api.state_scripts["j-1"] = ["RUNNING"] * 30 + ["COMPLETE"]
    assert run(api, "watch", "j-1", "--interval", "1") == 0
    assert len(sleeps) == 30


def test_watch_until_a_state_stops_there_and_a_job_ending_first_exits_as_usual(api, sleeps, capsys):
    """`watch ID --until RUNNING` (what a script waits for before it injects a fault or reads
    logs): exit 0 once the job is RUNNING, not when it ends; a job that fails first exits 1;
    a state that does not exist is a usage error naming it."""
    api.add_job("j-1", state="QUEUED")
    api.state_scripts["j-1"] = ["QUEUED", "STARTING", "RUNNING", "RUNNING", "COMPLETE"]
    assert run(api, "watch", "j-1", "--until", "running", "--interval", "1") == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[2:5] == ["STARTING", "->", "RUNNING"]
    assert len(sleeps) == 2
    api.add_job("j-2", state="QUEUED")
    api.state_scripts["j-2"] = ["QUEUED", "FAILED"]
    assert run(api, "watch", "j-2", "--until", "RUNNING", "--interval", "1") == 1
    assert run(api, "watch", "j-2", "--until", "RUNING") == 2
    assert "not a job state: 'RUNING'" in capsys.readouterr().err


def test_show_and_watch_say_why_a_job_moved_and_what_it_avoided(api, sleeps, capsys):
    """Given a job moved off a node whose driver asked for a reset (at its checkpoint), then
    asked again on another node and not checkpointing in time,
    when `show ID` and `watch ID` run,
    then show lists both moves (node, outcome, the warning and how sure, the rule) and what the
    move avoided; watch's SUSPENDING line names the warning."""
    node = "68fe8666-6fb5-445c-995c-d1ae6d7cefa5"
    moves = [{"at": 1_763_650_000, "node": node, "rule": "gpu-recovery-action-reset", "action": "reset_gpu",
              "confidence": "announced", "outcome": "moved", "checkpoint_seconds": 15},
             {"at": 1_763_651_000, "node": "n-2", "rule": "gpu-nvlink-replay-rising", "action": "reboot",
              "confidence": "predicted", "outcome": "declined", "detail": "no go_suspend() within 600 s"}]
    avoid = {"node": node, "action": "reset_gpu", "confidence": "announced"}
    api.add_job("j-1", state="RUNNING", attempt=2, suspend_count=1, resume_count=1, moves=moves,
                suspend={"kind": "moved", "reason": "driver warning", "avoid": avoid})
    assert run(api, "show", "j-1") == 0
    out = capsys.readouterr().out
    assert "\nMoves off nodes with a driver warning:\n" in out
    assert "moved at its checkpoint in 15 s" in out and "reset_gpu announced by the driver" in out
    assert "not moved: no checkpoint in time, kept running" in out and "reboot predicted (a counter)" in out
    assert "Avoided: a crash on a GPU the driver warned about" in out
    api.add_job("j-2", state="RUNNING", attempt=1)
    moving = {"state": "SUSPENDING", "suspend": {"kind": "moved", "avoid": avoid}}
    api.state_scripts["j-2"] = ["RUNNING", moving, {"state": "SUSPENDED"},
                                {"state": "STARTING", "attempt": 2}, "COMPLETE"]
    assert run(api, "watch", "j-2") == 0
    lines = capsys.readouterr().out.splitlines()
    assert "suspend=moved" in lines[1] and "warning=reset_gpu:announced" in lines[1]


# --------------------------------------------------------------------------- goodput (issue 52)


GOODPUT_NOW = 1_800_000_000.0


def goodput_ledger(**seconds: float) -> dict[str, Any]:
    wall = sum(seconds.values())
    own = sum(seconds.get(c, 0.0) for c in ("suspended", "preempted", "queued", "application_error"))
    ettr = seconds.get("productive", 0.0) / (wall - own)
    return {"wall_seconds": wall, "seconds": seconds, "ettr": ettr,
            "stack_share_seconds": seconds.get("detection", 0.0) + seconds.get("diagnosis", 0.0),
            "own_seconds": own, "faults": 1, "lost_work_unknown_faults": 0,
            "lost_work": seconds.get("lost_work", 0.0),
            "top_nodes": [{"name": "ci-7", "seconds": 900.0}],
            "top_rules": [{"name": "xid-79", "seconds": 900.0}]}


@pytest.fixture
def goodput_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpujobs_clock, "utcnow", lambda: datetime.fromtimestamp(GOODPUT_NOW, UTC))


def test_show_prints_the_jobs_ledger(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """Given a job whose ledger has a fault (lost work, detection, diagnosis, repair) and a
    preemption, When `gpujobs show` runs, Then it prints ETTR, one row per cause with its
    share (the job's own marked) and the costliest node and fault; --json has the ledger."""
    api.add_job("ft-1", state="RUNNING", goodput=goodput_ledger(productive=8000, lost_work=600, detection=30,
                                                        diagnosis=120, repair=150, preempted=1100))
    assert run(api, "show", "ft-1") == 0
    out = capsys.readouterr().out
    assert "Goodput:    ETTR 89.9 % of 2:46:40 wall" in out
    assert "lost_work" in out and "0:10:00" in out and "preempted" in out and "the job's own" in out
    assert "costliest nodes: ci-7 0:15:00" in out and "costliest faults: xid-79" in out
    assert "validation" not in out  # no time: no row
    assert run(api, "show", "ft-1", "--json") == 0
    assert json.loads(capsys.readouterr().out)["goodput"]["seconds"]["repair"] == 150


def test_show_says_when_lost_work_is_unknown(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    book = {**goodput_ledger(productive=1000, diagnosis=60), "lost_work_unknown_faults": 1,
            "lost_work": "unknown"}
    api.add_job("ft-2", state="RUNNING", goodput=book)
    assert run(api, "show", "ft-2") == 0
    out = capsys.readouterr().out
    assert "unknown" in out and "no checkpoint reported" in out


def test_goodput_sums_a_users_recent_jobs_in_gpu_hours(api: FakeApi, capsys: pytest.CaptureFixture[str],
                                                        goodput_now: None) -> None:
    """Given two of alice's jobs within the week (2x8 GPUs each) and one older, When
    `gpujobs goodput --since 7d --json` runs, Then it sums the two: GPU-hours per cause and the
    GPU-weighted ETTR; the table view prints the same."""
    api.add_job("a-1", state="COMPLETE", submitted_at=GOODPUT_NOW - 3600,
                goodput=goodput_ledger(productive=3600, repair=1800))
    api.add_job("a-2", state="RUNNING", submitted_at=GOODPUT_NOW - 86400,
                goodput=goodput_ledger(productive=1800, suspended=900))
    api.add_job("a-0", state="COMPLETE", submitted_at=GOODPUT_NOW - 30 * 86400,
                goodput=goodput_ledger(productive=99_999))
    assert run(api, "goodput", "--since", "7d", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["jobs"] == 2
    assert summary["gpu_hours"] == {"productive": 24.0, "repair": 8.0, "suspended": 4.0}
    assert summary["ettr"] == pytest.approx(24 / 32)
    assert run(api, "goodput") == 0
    out = capsys.readouterr().out
    assert "2 job(s), 36.0 GPU-hours, ETTR 75.0 %" in out and "repair" in out


def test_goodput_refuses_a_bad_period(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(api, "goodput", "--since", "a week") == 2  # argparse's usage error
    assert "a period like 7d or 36h" in capsys.readouterr().err
    assert api.requests == []
