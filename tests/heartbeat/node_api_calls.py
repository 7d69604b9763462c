"""Calls of the node API's handler as API Gateway sends them, and what they wrote."""

from __future__ import annotations

import json
from typing import Any

from handlers import node_api
from local_mode.server import API_TIMEOUT_SECONDS
from local_mode.sim.lambda_context import LambdaContext
from tests.fixtures.events import load_event
from tests.heartbeat.world import NODE


def ctx(name: str = "node-api") -> LambdaContext:
    return LambdaContext(name, timeout_seconds=API_TIMEOUT_SECONDS)


def api_event(world, name: str, body: Any, node: str = NODE) -> dict[str, Any]:
    event = load_event(name)
    event["body"] = body if isinstance(body, str) else json.dumps(body)
    event["requestContext"]["authorizer"] = {"principalId": node, "node_id": node}
    return event


def call(event: dict[str, Any]) -> tuple[int, Any]:
    response = node_api.lambda_handler(event, ctx())
    return response["statusCode"], json.loads(response["body"])


def tasks_body(world, *arns: str, node: str = NODE, ts: float | None = None) -> dict[str, Any]:
    return {"node_id": node, "timestamp": world.clock() if ts is None else ts,
            "tasks": [{"task_arn": a} for a in arns]}


def snapshot(world) -> list[dict[str, Any]]:
    ddb = world.local.client("dynamodb")
    items = []
    for table in (world.repo.tables.job_table_name, world.repo.tables.instance_table_name):
        items += sorted(ddb.scan(TableName=table)["Items"], key=lambda i: json.dumps(i, sort_keys=True))
    return items
