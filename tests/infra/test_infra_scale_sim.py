"""The scale simulator models the recovery functions the stack deploys: their timeouts and
Lambda's asynchronous retries and event ages (local_mode/scale_recovery.py)."""

from __future__ import annotations

from infra_synth import Synth

from local_mode.scale_recovery import ASYNC_RETRIES, FUNCTION_TIMEOUTS, MAX_EVENT_AGE


def test_the_scale_simulator_uses_the_deployed_timeouts_and_retries(default_synth: Synth) -> None:
    functions = default_synth.resources("AWS::Lambda::Function")
    configs = default_synth.resources("AWS::Lambda::EventInvokeConfig").values()
    by_handler = {f["Properties"]["Handler"]: logical for logical, f in functions.items()}
    for name, timeout in FUNCTION_TIMEOUTS.items():
        logical = by_handler[f"handlers.{name}.lambda_handler"]
        assert functions[logical]["Properties"]["Timeout"] == timeout, name
        (config,) = [c for c in configs if c["Properties"]["FunctionName"]["Ref"] == logical]
        assert config["Properties"]["MaximumRetryAttempts"] == ASYNC_RETRIES, name
        assert config["Properties"]["MaximumEventAgeInSeconds"] == MAX_EVENT_AGE[name], name
