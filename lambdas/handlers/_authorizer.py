"""What the two Lambda TOKEN authorizers (node API, job control) share: their Powertools
objects, the token as API Gateway hands it over, and the IAM policy they answer with.

An authorizer's policy covers every route it guards on the calling API and stage, not just
the method called, because API Gateway caches the policy by token for all of them.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics

from gpu_recovery.metric_names import METRICS_NAMESPACE

UNAUTHORIZED = "Unauthorized"  # the exact message API Gateway maps to 401


def powertools(service: str) -> tuple[Logger, Metrics]:
    """An authorizer's logger and metrics. No Tracer (nor the parser of ``handlers._common``):
    an authorizer is one GetItem and an HMAC, Lambda's active tracing records its invocation,
    and importing the X-Ray SDK would be about a third of its cold start (docs/benchmarks.md)."""
    return Logger(service=service), Metrics(namespace=METRICS_NAMESPACE, service=service)


def authorization(event: dict[str, Any]) -> str | None:
    """The Authorization value of a TOKEN event, or of a REQUEST event's headers (what local
    mode sends)."""
    if event.get("type") == "TOKEN" or "authorizationToken" in event:
        return event.get("authorizationToken")
    headers = {str(k).lower(): v for k, v in (event.get("headers") or {}).items()}
    return headers.get("authorization")


def route_resources(method_arn: str, routes: tuple[tuple[str, str], ...]) -> list[str]:
    """``routes`` ((method, path) pairs) on the calling API and stage of ``method_arn``
    (``arn:aws:execute-api:region:account:api-id/stage/METHOD/path``)."""
    prefix, _, rest = method_arn.partition("/")
    stage = rest.split("/", 1)[0] if rest else "*"
    if not prefix.startswith("arn:"):
        return [method_arn or "*"]
    return [f"{prefix}/{stage}/{method}/{path}" for method, path in routes]


def policy(principal: str, effect: str, method_arn: str, routes: tuple[tuple[str, str], ...],
           context: dict[str, str] | None = None) -> dict[str, Any]:
    """The authorizer's answer: ``effect`` (Allow / Deny) on ``routes``, with ``context``
    for the integration."""
    response: dict[str, Any] = {
        "principalId": principal,
        "policyDocument": {"Version": "2012-10-17", "Statement": [
            {"Action": "execute-api:Invoke", "Effect": effect,
             "Resource": route_resources(method_arn, routes)}]},
    }
    if context:
        response["context"] = context
    return response
