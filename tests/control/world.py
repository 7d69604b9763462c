"""The training client against the real local API: ``LocalApiServer`` over HTTP on 127.0.0.1
(the control and jobs handlers, the control authorizer), the emulator behind it, and a
simulated GPU cluster whose ranks were started by the real scheduler tick (so their
environment is the launcher's)."""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpu_recovery import constants as C
from local_mode.scripts import load_script
from local_mode.server import ApiResponse, LocalApi, LocalApiServer, gateway_error
from tests.fixtures.queue_cluster import QueueCluster

REPO = Path(__file__).resolve().parents[2]
CLIENT_PATH = REPO / "training_client" / "gpu_recovery_client.py"


# The shipped file itself (users copy it or pip install it; it is not in a package here).
client_lib = load_script("gpu_recovery_client", CLIENT_PATH)


ALICE = "alice"
BOB = "bob"


class RecordingApi(LocalApi):
    """The local API, recording what reached it (and, when asked, answering the next
    requests with API Gateway's own 429, as a throttled stage does)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: list[tuple[str, str, int]] = []
        self.throttle_next = 0
        self._record_lock = threading.Lock()

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes,
               source_ip: str = "127.0.0.1") -> ApiResponse:
        with self._record_lock:
            throttled = self.throttle_next > 0
            self.throttle_next -= 1 if throttled else 0
        response = gateway_error("THROTTLED") if throttled else \
            super().handle(method, raw_path, headers, body, source_ip)
        with self._record_lock:
            self.requests.append((method, raw_path, response.status))
        return response

    def count(self, method: str, path: str) -> int:
        """Requests to ``path`` (stage prefix and query string ignored)."""
        def bare(raw: str) -> str:
            p = raw.partition("?")[0]
            return p[len("/prod"):] if p.startswith("/prod/") else p
        with self._record_lock:
            return sum(1 for m, p, _ in self.requests if m == method and bare(p) == path)


@dataclass
class ControlWorld:
    qc: QueueCluster
    server: LocalApiServer
    api: RecordingApi
    state_dir: Path
    td: str
    authorizer_calls: list[str] = field(default_factory=list)
    stop_task_calls: list[str] = field(default_factory=list)

    @property
    def control_url(self) -> str:
        """What the launcher gives every rank: the API URL with its stage."""
        return f"{self.server.url}/prod"

    def http(self, method: str, path: str, *, body: Any = None, headers: dict[str, str] | None = None,
             user: str | None = None) -> tuple[int, Any]:
        parts = urlsplit(self.server.url)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
        sent = dict(headers or {})
        if user:
            sent["X-Local-User"] = user
        payload = json.dumps(body).encode() if body is not None else b""
        if body is not None:
            sent["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=payload, headers=sent)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        return response.status, json.loads(raw or b"null")

    def submit(self, *, user: str = ALICE, nnodes: int = 2, priority: str = "LOW") -> str:
        """Through the jobs API, as ``gpujobs submit`` does."""
        status, body = self.http("POST", "/v1/jobs", user=user, body={
            "name": "ft", "task_definition": self.td, "nnodes": nnodes, "gpus_per_node": 8,
            "priority": priority, "overrides": {"command": ["python", "train.py"]}})
        assert status == 201, body
        return str(body["job_id"])

    def start(self, *, user: str = ALICE, nnodes: int = 2) -> str:
        """Submitted, admitted by the real tick, every rank RUNNING on the simulated cluster."""
        job = self.submit(user=user, nnodes=nnodes)
        assert self.qc.scheduler().tick().admitted == [job]
        self.qc.sim.run_for(30)
        assert self.qc.state(job) is C.JobState.RUNNING
        return job

    def rank_env(self, job: str, rank: int) -> dict[str, str]:
        [task] = [t for t in self.qc.live_tasks(job) if t.tags[C.TAG_RANK] == str(rank)]
        [override] = task.overrides["containerOverrides"]
        return {e["name"]: e["value"] for e in override["environment"]}

    def client(self, job: str, rank: int, **kwargs: Any) -> Any:
        """The client a process of rank ``rank`` builds from its environment."""
        kwargs.setdefault("state_dir", str(self.state_dir / f"rank-{rank}"))
        Path(kwargs["state_dir"]).mkdir(exist_ok=True)
        return client_lib.SuspendClient.from_env(self.rank_env(job, rank), **kwargs)

    def user_suspend(self, job: str, user: str = ALICE) -> dict[str, Any]:
        status, body = self.http("POST", f"/v1/jobs/{job}/suspend", user=user)
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    def item(self, job: str) -> dict[str, Any]:
        return self.qc.item(job)
