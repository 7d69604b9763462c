"""Lambda TOKEN authorizer of the node API: ``Authorization: Bearer <node_id>.<secret>``.

* missing / malformed header, unknown node, revoked token -> ``Unauthorized`` (401)
* a known node with the wrong secret -> Deny policy (API Gateway answers 403)
* a valid token -> Allow on the node routes, with ``node_id`` in the context (the
  handler checks the body's ``node_id`` against it)

The token is looked up by key (node id before the last ``.``) and compared as a
SHA-256 hash in constant time; the token itself is never logged. REQUEST events
(``headers.Authorization``) are accepted too, which is what local mode sends.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from gpu_recovery.heartbeat.tokens import TokenStore, Verdict, token_from_authorization
from handlers._common import powertools

logger, tracer, metrics = powertools("node-authorizer")

UNAUTHORIZED = "Unauthorized"  # the exact message API Gateway maps to 401
NODE_ROUTES = ("POST/v1/report_tasks", "POST/v1/report_gpu")

def token_store() -> TokenStore:
    return runtime.node_token_store()


def _authorization(event: dict[str, Any]) -> str | None:
    if event.get("type") == "TOKEN" or "authorizationToken" in event:
        return event.get("authorizationToken")
    headers = {str(k).lower(): v for k, v in (event.get("headers") or {}).items()}
    return headers.get("authorization")


def _resources(method_arn: str) -> list[str]:
    """Both node routes of the calling API and stage, so a cached policy covers them."""
    # arn:aws:execute-api:region:account:api-id/stage/METHOD/path...
    prefix, _, rest = method_arn.partition("/")
    stage = rest.split("/", 1)[0] if rest else "*"
    if not prefix.startswith("arn:"):
        return [method_arn or "*"]
    return [f"{prefix}/{stage}/{route}" for route in NODE_ROUTES]


def policy(principal: str, effect: str, method_arn: str, context: dict[str, str] | None = None) -> dict:
    response: dict[str, Any] = {
        "principalId": principal,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": effect,
                           "Resource": _resources(method_arn)}],
        },
    }
    if context:
        response["context"] = context
    return response


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    token = token_from_authorization(_authorization(event))
    result = token_store().verify(token)
    method_arn = str(event.get("methodArn", ""))
    metrics.add_metric(name=f"Auth{result.verdict.value.title()}", unit="Count", value=1)
    if result.verdict is Verdict.OK:
        return policy(result.node_id, "Allow", method_arn, {"node_id": result.node_id})
    logger.warning("node authentication failed",
                   extra={"verdict": result.verdict.value, "node_id": result.node_id or "-"})
    if result.verdict is Verdict.MISMATCH:
        return policy(result.node_id, "Deny", method_arn)
    raise Exception(UNAUTHORIZED)  # API Gateway maps exactly this message to 401
