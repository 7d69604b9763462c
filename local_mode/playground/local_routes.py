"""The playground's local-only routes (never deployed) beside the local API's:
``GET /local``, ``GET /local/nodes``, ``POST /local/faults``."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from gpu_recovery import constants as C
from local_mode.playground.config import PlaygroundConfig, PlaygroundError
from local_mode.playground.console import iso
from local_mode.server import ApiResponse, LocalApi, LocalApiServer

LOCAL_PREFIX = "/local"


class PlaygroundView(Protocol):
    """What the routes read of the playground (``driver.Playground``)."""

    config: PlaygroundConfig
    sim: Any
    server: LocalApiServer | None
    aws_url: str
    slipped_seconds: float
    task_definitions: dict[str, str]

    def world(self) -> AbstractContextManager[None]: ...

    def api_called(self, method: str, path: str, headers: dict[str, str], response: ApiResponse) -> None: ...

    def inject(self, doc: dict[str, Any]) -> dict[str, Any]: ...


class PlaygroundApi(LocalApi):
    """The local API, plus the playground's local-only routes (never deployed):

    * ``GET /local`` — the playground: simulated time, speed, endpoints;
    * ``GET /local/nodes`` — every node: health, agent, GPUs free, what runs there;
    * ``POST /local/faults`` — inject a fault (``{"kind": "xid" | "dead_gpu" | "flap" |
      "app_error" | "lost_node", "node" | "job_id" [+ "rank"], ...}``), 202 with what
      was injected.

    Jobs-API requests run while the simulation is held (the world lock).
    """

    def __init__(self, playground: PlaygroundView) -> None:
        super().__init__()
        self.playground = playground
        self.local_routes = LocalRoutes(playground)

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes,
               source_ip: str = "127.0.0.1") -> ApiResponse:
        path = self._strip_stage(raw_path.partition("?")[0], self.stage)
        if path == LOCAL_PREFIX or path.startswith(LOCAL_PREFIX + "/"):
            return self.local_routes.handle(method, path, body)
        if not (path.startswith("/v1/jobs") or path.startswith("/v1/quotas") or path == "/swagger"):
            return super().handle(method, raw_path, headers, body, source_ip)
        with self.playground.world():
            response = super().handle(method, raw_path, headers, body, source_ip)
        self.playground.api_called(method, path, headers, response)
        return response


class LocalRoutes:
    """``/local`` and below: a JSON body in, a JSON answer out, run while the simulation is
    held (the world lock)."""

    def __init__(self, playground: PlaygroundView) -> None:
        self.playground = playground

    def handle(self, method: str, path: str, body: bytes) -> ApiResponse:
        routes: dict[tuple[str, str], Callable[[dict[str, Any]], tuple[int, Any]]] = {
            ("GET", LOCAL_PREFIX): lambda _doc: (200, self.describe()),
            ("GET", f"{LOCAL_PREFIX}/nodes"): lambda _doc: (200, {"nodes": self.nodes()}),
            ("POST", f"{LOCAL_PREFIX}/faults"): lambda doc: (202, self.playground.inject(doc)),
        }
        route = routes.get((method, path.rstrip("/") or "/"))
        if route is None:
            known = ", ".join(f"{m} {p}" for m, p in routes)
            return _answer(404, {"error": "NOT_FOUND",
                                 "message": f"no local route {method} {path} ({known})"})
        try:
            doc = json.loads(body or b"{}")
            if not isinstance(doc, dict):
                raise PlaygroundError("the body must be a JSON object")
            with self.playground.world():
                status, payload = route(doc)
        except ValueError as error:  # bad JSON
            return _answer(400, {"error": "BAD_REQUEST", "message": f"body: {error}"})
        except PlaygroundError as error:
            code = {400: "BAD_REQUEST", 409: "CONFLICT"}.get(error.status, "NOT_FOUND")
            return _answer(error.status, {"error": code,
                                          "message": str(error), "field": error.field})
        return _answer(status, payload)

    def describe(self) -> dict[str, Any]:
        pg = self.playground
        return {"api": pg.server.url if pg.server else "", "aws_endpoint": pg.aws_url,
                "speed": pg.config.speed, "simulated_time": iso(pg.sim.now()),
                "simulated_seconds_dropped": round(pg.slipped_seconds, 1),
                "nodes": len(pg.sim.nodes), "task_definitions": sorted(pg.task_definitions),
                "run_minutes": pg.config.run_minutes}

    def nodes(self) -> list[dict[str, Any]]:
        sim = self.playground.sim
        out = []
        for name in sorted(sim.nodes, key=lambda n: (len(n), n)):
            node = sim.nodes[name]
            tasks = []
            for task in sim.running_tasks(name):
                tags = task.tags
                tasks.append({"job_id": tags.get(C.TAG_JOB_ID), "rank": tags.get(C.TAG_RANK),
                              "attempt": tags.get(C.TAG_ATTEMPT), "state": task.last_status,
                              "health_check": task.health_check, "gpus": len(task.gpu_ids)})
            out.append({"name": name, "instance_id": node.instance_id,
                        "container_instance_id": node.container_instance_id,
                        "status": sim._ci_status(node), "agent_connected": node.agent_connected,
                        "rebooting": node.rebooting, "health": node.health, "gpus": len(node.gpu_ids),
                        "free_gpus": len(node.free_gpu_ids), "reboots": node.reboots, "tasks": tasks})
        return out


def _answer(status: int, payload: Any) -> ApiResponse:
    return ApiResponse(status, {"Content-Type": "application/json"}, json.dumps(payload).encode())
