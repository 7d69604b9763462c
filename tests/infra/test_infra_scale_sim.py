"""The scale simulator models the recovery functions the stack deploys: their timeouts and
Lambda's asynchronous retries and event ages (local_mode/scale_recovery.py)."""

from __future__ import annotations

from infra_synth import Synth

from gpu_recovery import constants as c
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


def test_the_scale_simulator_models_the_deployed_gang_queue_and_worker(default_synth: Synth) -> None:
    """The gang fan-out in the simulator: the worker's timeout, the queue's visibility timeout
    and redrive, the event source's batch size and maximum concurrency, as deployed."""
    from local_mode import scale_recovery as sr

    functions = default_synth.resources("AWS::Lambda::Function")
    (worker,) = [f for f in functions.values()
                 if f["Properties"]["Handler"] == f"handlers.{sr.GANG_WORKER}.lambda_handler"]
    assert worker["Properties"]["Timeout"] == sr.GANG_WORKER_TIMEOUT_SECONDS
    worker_id = next(k for k, f in functions.items() if f is worker)
    (mapping,) = [m for m in default_synth.resources("AWS::Lambda::EventSourceMapping").values()
                  if m["Properties"]["FunctionName"] == {"Ref": worker_id}]
    props = mapping["Properties"]
    assert props["BatchSize"] == sr.GANG_BATCH_SIZE
    assert props["ScalingConfig"] == {"MaximumConcurrency": sr.GANG_WORKER_CONCURRENCY}
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    queues = [q["Properties"] for q in default_synth.resources("AWS::SQS::Queue").values()
              if "RedrivePolicy" in q["Properties"]]
    assert sorted((q["VisibilityTimeout"], q["RedrivePolicy"]["maxReceiveCount"]) for q in queues) == sorted([
        (sr.GANG_VISIBILITY_TIMEOUT_SECONDS, sr.GANG_MAX_RECEIVES),
        (c.TAG_LOOKUP_VISIBILITY_TIMEOUT_SECONDS, c.TAG_LOOKUP_MAX_RECEIVES)])
    handler = f"handlers.{sr.TAG_LOOKUP_WORKER}.lambda_handler"
    lookup_worker_id = next(k for k, f in functions.items() if f["Properties"]["Handler"] == handler)
    (lookups,) = [m["Properties"] for m in default_synth.resources("AWS::Lambda::EventSourceMapping").values()
                  if m["Properties"]["FunctionName"] == {"Ref": lookup_worker_id}]
    assert lookups["BatchSize"] == c.TAG_LOOKUP_BATCH_SIZE
    assert lookups["MaximumBatchingWindowInSeconds"] == c.TAG_LOOKUP_BATCHING_WINDOW_SECONDS
    assert lookups["ScalingConfig"] == {"MaximumConcurrency": c.TAG_LOOKUP_WORKER_CONCURRENCY}
