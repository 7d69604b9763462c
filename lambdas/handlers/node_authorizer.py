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
from gpu_recovery.api_routes import NODE_API_ROUTES
from gpu_recovery.heartbeat.tokens import TokenStore, Verdict, token_from_authorization
from handlers._authorizer import UNAUTHORIZED, authorization, policy, powertools

logger, metrics = powertools("node-authorizer")


def token_store() -> TokenStore:
    return runtime.node_token_store()


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    token = token_from_authorization(authorization(event))
    result = token_store().verify(token)
    method_arn = str(event.get("methodArn", ""))
    metrics.add_metric(name=f"Auth{result.verdict.value.title()}", unit="Count", value=1)
    if result.verdict is Verdict.OK:
        return policy(result.node_id, "Allow", method_arn, NODE_API_ROUTES, {"node_id": result.node_id})
    logger.warning("node authentication failed",
                   extra={"verdict": result.verdict.value, "node_id": result.node_id or "-"})
    if result.verdict is Verdict.MISMATCH:
        return policy(result.node_id, "Deny", method_arn, NODE_API_ROUTES)
    raise Exception(UNAUTHORIZED)  # API Gateway maps exactly this message to 401
