"""The simulated worlds wire the recovery functions from one table,
``local_mode/sim/deployment.py``: its rules, schedule, queues, timeouts and Lambda's
asynchronous retries are the synthesized template's."""

from __future__ import annotations

import json
from typing import Any

from infra_synth import CLUSTER_ARN, Synth

from local_mode.sim import deployment as D


def _function_ids(synth: Synth) -> dict[str, str]:
    """handler module name -> logical id of its function."""
    functions = synth.resources("AWS::Lambda::Function")
    return {f["Properties"]["Handler"].split(".")[1]: logical for logical, f in functions.items()}


def _targets(synth: Synth, rule: dict[str, Any]) -> list[str]:
    ids = {logical: name for name, logical in _function_ids(synth).items()}
    return [ids[t["Arn"]["Fn::GetAtt"][0]] for t in rule["Properties"]["Targets"]]


def test_the_tables_functions_have_the_deployed_timeouts_and_async_retries(default_synth: Synth) -> None:
    functions = default_synth.resources("AWS::Lambda::Function")
    configs = default_synth.resources("AWS::Lambda::EventInvokeConfig").values()
    ids = _function_ids(default_synth)
    for name, function in {**D.FUNCTIONS, **D.SCHEDULED_FUNCTIONS}.items():
        logical = ids[name]
        assert functions[logical]["Properties"]["Handler"] == function.handler
        assert functions[logical]["Properties"]["Timeout"] == function.timeout_seconds, name
        invoke_configs = [c["Properties"] for c in configs
                          if c["Properties"]["FunctionName"]["Ref"] == logical]
        if function.retries is None:  # a queue worker: its event source invokes it, synchronously
            assert invoke_configs == [], name
            continue
        (config,) = invoke_configs
        assert config["MaximumRetryAttempts"] == function.retries.attempts, name
        assert len(function.retries.delays) >= function.retries.attempts, name
        assert config["MaximumEventAgeInSeconds"] == function.retries.max_event_age_seconds, name


def test_the_tables_rules_and_schedules_are_the_deployed_ones(default_synth: Synth) -> None:
    """Each event rule: the deployed pattern (the default registration, "both") to its one
    function; each schedule: its rate to its function; nothing else targets these functions."""
    deployed_patterns: dict[str, list[str]] = {}
    deployed_rates: dict[str, str] = {}
    for rule in default_synth.resources("AWS::Events::Rule").values():
        targets = [t for t in _targets(default_synth, rule) if t in {**D.FUNCTIONS, **D.SCHEDULED_FUNCTIONS}]
        if not targets:
            continue
        (function,) = targets
        if "EventPattern" in rule["Properties"]:
            deployed_patterns.setdefault(function, []).append(json.dumps(rule["Properties"]["EventPattern"],
                                                                         sort_keys=True))
        else:
            deployed_rates[function] = rule["Properties"]["ScheduleExpression"]
    wanted: dict[str, list[str]] = {}
    for rule in D.RULES:  # the instance monitor has three (its own, AWS's notices)
        pattern = json.dumps(rule.pattern(CLUSTER_ARN, "both"), sort_keys=True)
        wanted.setdefault(rule.function, []).append(pattern)
    assert {f: sorted(p) for f, p in deployed_patterns.items()} == {f: sorted(p) for f, p in wanted.items()}
    assert deployed_rates == {s.function: f"rate({s.every_seconds / 60:g} minute)" for s in D.ALL_SCHEDULES}
    assert all(s.every_seconds == 60 for s in D.ALL_SCHEDULES)  # the rate expression above is singular


def test_the_tables_queues_and_event_sources_are_the_deployed_ones(default_synth: Synth) -> None:
    """Each worker's event source (batch size, batching window, maximum concurrency, partial
    batch responses) and its queue (visibility timeout, redrive after so many receives)."""
    ids = _function_ids(default_synth)
    queues = default_synth.resources("AWS::SQS::Queue")
    mappings = [m["Properties"] for m in default_synth.resources("AWS::Lambda::EventSourceMapping").values()]
    for source in D.QUEUES:
        (mapping,) = [m for m in mappings if m["FunctionName"] == {"Ref": ids[source.function]}]
        assert mapping["BatchSize"] == source.batch_size, source.name
        assert mapping.get("MaximumBatchingWindowInSeconds", 0) == source.batching_window_seconds, source.name
        assert mapping["ScalingConfig"] == {"MaximumConcurrency": source.max_concurrency}, source.name
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"], source.name
        queue = queues[mapping["EventSourceArn"]["Fn::GetAtt"][0]]["Properties"]
        assert queue["VisibilityTimeout"] == source.visibility_timeout_seconds, source.name
        assert queue["RedrivePolicy"]["maxReceiveCount"] == source.max_receives, source.name
