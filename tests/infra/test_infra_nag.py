"""cdk-nag 3.x (AwsSolutions) must report nothing unacknowledged."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_sqs as sqs
from infra_synth import Synth

from infra.nag import acknowledge, add_nag_checks, read_findings


def test_default_stack_has_no_unacknowledged_findings(default_synth: Synth) -> None:
    """Given the default configuration synthesized with the AwsSolutions pack,
    Then synthesis succeeded and the validation report lists no finding."""
    assert default_synth.error is None, default_synth.findings
    assert default_synth.findings == []


def test_custom_stack_has_no_unacknowledged_findings(custom_synth: Synth) -> None:
    """Given e-mail, destroy, own task definition, arm64: Then no finding either."""
    assert custom_synth.error is None, custom_synth.findings
    assert custom_synth.findings == []


def test_agent_stack_has_no_unacknowledged_findings(agent_synth: Synth) -> None:
    """Given the node-agent daemon on and every heartbeat / API option changed,
    Then no finding either (the ECS daemon service and task definition included)."""
    assert agent_synth.error is None, agent_synth.findings
    assert agent_synth.findings == []
    assert agent_synth.resources("AWS::ECS::Service")


def test_an_unacknowledged_finding_fails_the_check(tmp_path) -> None:
    """Given a queue that breaks AwsSolutions-SQS3/SQS4 with only SQS3 acknowledged,
    When synthesized with the same wiring, Then synthesis fails and SQS4 is reported
    (the harness above would catch a new, unacknowledged finding)."""
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Probe")
    queue = sqs.Queue(stack, "Queue")
    acknowledge(queue, ("AwsSolutions-SQS3", "probe queue used only to prove the check fails"))
    add_nag_checks(app)
    try:
        app.synth()
        failed = False
    except RuntimeError as exc:
        failed = "Validation failed" in str(exc) or "ValidationFailed" in str(exc)
    assert failed
    rules = {f["rule"] for f in read_findings(tmp_path)}
    assert rules == {"AwsSolutions-SQS4"}
