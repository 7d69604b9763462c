"""Lambda TOKEN authorizer of the job-control routes: ``Authorization: Bearer <control token>``.

The token (``<job_id>.<rank>.<mac>``, see ``gpu_recovery.domain.control_token``) is the one
the launcher put in the rank's environment. It is checked against the job's secret (one
GetItem of the job item) in constant time and never logged.

* no header, or one that is not a well-formed control token -> ``Unauthorized`` (401)
* an unknown job, a job without a control secret, a wrong MAC -> Deny (API Gateway: 403)
* a valid token -> Allow on the control routes, with ``job_id`` and ``rank`` in the context
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from gpu_recovery.api_routes import CONTROL_API_ROUTES
from gpu_recovery.domain.control_token import authorize, parse_token
from gpu_recovery.heartbeat.tokens import token_from_authorization
from handlers._authorizer import UNAUTHORIZED, authorization, policy, powertools

logger, metrics = powertools("job-control-authorizer")

@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    token = token_from_authorization(authorization(event)) or ""
    method_arn = str(event.get("methodArn", ""))
    claimed = parse_token(token)
    if claimed is None:
        metrics.add_metric(name="ControlAuthMalformed", unit="Count", value=1)
        raise Exception(UNAUTHORIZED)  # API Gateway maps exactly this message to 401
    verified = authorize(token, runtime.control_secrets().of)
    principal = f"{claimed[0]}/rank-{claimed[1]}"
    if verified is None:
        metrics.add_metric(name="ControlAuthDenied", unit="Count", value=1)
        logger.warning("job-control token refused", extra={"job_id": claimed[0], "rank": claimed[1]})
        return policy(principal, "Deny", method_arn, CONTROL_API_ROUTES)
    metrics.add_metric(name="ControlAuthOk", unit="Count", value=1)
    return policy(principal, "Allow", method_arn, CONTROL_API_ROUTES,
                  {"job_id": verified[0], "rank": str(verified[1])})
