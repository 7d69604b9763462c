"""Settings parsing and operator messages."""

from __future__ import annotations

import pytest

from gpu_recovery import constants as c
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain.notifications import NotificationFacts, build
from gpu_recovery.settings import Settings, SettingsError, parse_exit_codes

BASE = {c.ENV_JOB_TABLE: "jobs", c.ENV_INSTANCE_TABLE: "instances", c.ENV_CLUSTER_NAME: "gpu"}


def test_defaults_match_the_documented_ones() -> None:
    s = Settings.from_env(BASE)
    assert s.max_recovery_attempts == 3  # infrastructure recoveries
    assert s.max_app_restarts == 0
    assert s.suspect_exit_codes == (1,)
    assert s.reboot_timeout_seconds == 30 * 60
    assert s.health_check_task == c.DEFAULT_HEALTH_CHECK_FAMILY
    assert s.remediation.modes.describe() == "enforce"
    assert s.remediation.replace_action == "quarantine"
    assert s.remediation.breaker.max_share == 0.2 and s.remediation.breaker.window_seconds == 600
    assert s.relocate_instead_of_wait is False and s.fault_catalog_override == ""
    assert s.relocation_wait_seconds == 1800
    assert s.spare_nodes.size(128) == 0


def test_remediation_settings_come_from_one_json_variable_and_the_budget_variables() -> None:
    s = Settings.from_env({**BASE, c.ENV_REMEDIATION_SETTINGS: '{"remediation_mode": "observe", '
                                                              '"breaker_max_nodes": 4}',
                           c.ENV_MAX_RECOVERY_ATTEMPTS: "2", c.ENV_MAX_APP_RESTARTS: "1",
                           c.ENV_RELOCATE_INSTEAD_OF_WAIT: "true", c.ENV_RELOCATION_WAIT_SECONDS: "0"})
    assert s.remediation.modes.describe() == "observe"
    assert s.remediation.breaker.max_nodes == 4
    assert (s.max_recovery_attempts, s.max_app_restarts) == (2, 1)
    assert s.relocate_instead_of_wait is True and s.relocation_wait_seconds == 0


@pytest.mark.parametrize("raw", ["-1", "soon", str(7 * 24 * 3600 + 1)])
def test_a_bad_relocation_wait_fails_the_cold_start_naming_it(raw: str) -> None:
    with pytest.raises(SettingsError, match=c.ENV_RELOCATION_WAIT_SECONDS):
        Settings.from_env({**BASE, c.ENV_RELOCATION_WAIT_SECONDS: raw})


@pytest.mark.parametrize("raw", ["-1", "81", "many"])
def test_a_gang_inline_limit_past_one_start_batch_fails_the_cold_start_naming_it(raw: str) -> None:
    """0..80: a gang run inline is at most one start batch (0: every gang through the queue)."""
    assert Settings.from_env({**BASE, c.ENV_GANG_INLINE_MAX_RANKS: "0"}).gang_inline_max_ranks == 0
    assert Settings.from_env(BASE).gang_inline_max_ranks == 16
    with pytest.raises(SettingsError, match=c.ENV_GANG_INLINE_MAX_RANKS):
        Settings.from_env({**BASE, c.ENV_GANG_INLINE_MAX_RANKS: raw})


def test_spare_nodes_is_a_count_or_a_percentage_and_a_bad_one_fails_the_cold_start() -> None:
    assert Settings.from_env({**BASE, c.ENV_SPARE_NODES: "2"}).spare_nodes.size(128) == 2
    assert Settings.from_env({**BASE, c.ENV_SPARE_NODES: "5%"}).spare_nodes.size(128) == 7
    for raw in ("-1", "many", "51%"):
        with pytest.raises(SettingsError, match=c.ENV_SPARE_NODES):
            Settings.from_env({**BASE, c.ENV_SPARE_NODES: raw})


@pytest.mark.parametrize(("raw", "named"), [('{"replace_action": "melt"}', "replace_action"),
                                            ('{"breaker_max_percent": 0}', "breaker_max_percent"),
                                            ('{"typo_key": 1}', "typo_key"), ("[1]", "REMEDIATION_SETTINGS")])
def test_bad_remediation_settings_fail_the_cold_start_naming_the_key(raw: str, named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        Settings.from_env({**BASE, c.ENV_REMEDIATION_SETTINGS: raw})


@pytest.mark.parametrize(("raw", "codes"), [("[1, 134]", (1, 134)), ("1,134", (1, 134)), ("[]", ())])
def test_exit_codes_as_json_or_commas(raw: str, codes: tuple[int, ...]) -> None:
    assert parse_exit_codes(raw) == codes


@pytest.mark.parametrize("raw", ["[0]", "one", "[1.5x]"])
def test_bad_exit_codes_name_the_variable(raw: str) -> None:
    with pytest.raises(SettingsError, match=c.ENV_SUSPECT_EXIT_CODES):
        parse_exit_codes(raw)


def test_missing_variables_are_named() -> None:
    with pytest.raises(SettingsError, match=c.ENV_CLUSTER_NAME):
        Settings.from_env({c.ENV_JOB_TABLE: "a", c.ENV_INSTANCE_TABLE: "b"})


def test_notification_is_readable_and_filterable() -> None:
    """Given a failed recovery, Then the e-mail names job, ranks, instance, what happened,
    what was done, the attempt count and what to do, and carries its kind."""
    note = build(
        NotificationKind.QUARANTINED,
        "Job failed: GPU node quarantined",
        NotificationFacts(job_id="llama", ranks=[1], container_inst_id="ci-1", instance_id="i-0abc",
                          what_happened="rank 1 exited 1", what_was_done="drained",
                          attempt=1, max_attempts=1, operator_action="replace the node"),
    )
    assert note.kind is NotificationKind.QUARANTINED
    assert len(note.subject) < 100 and "llama" in note.subject
    for text in ("Job:", "llama", "Ranks:              1", "i-0abc", "rank 1 exited 1", "drained",
                 "Recovery attempt:   1 of 1", "What to do: replace the node"):
        assert text in note.body


@pytest.mark.parametrize(("headline", "job_id"), [
    # 100 characters: the old [:100] kept them all; SNS takes fewer than 100 (issue 40)
    ("Known-bad GPU nodes are no longer cordoned in ECS (cordon limit tripped)", ""),
    ("Job failed: instance health check could not start (5 placement attempt(s))", "job stuck"),
    ("Job recovered", "训练-ünïcode\nnext line"),  # a tag-registered job's id: any letters
])
def test_an_email_subject_is_one_sns_takes(headline: str, job_id: str) -> None:
    """SNS Publish: a Subject of fewer than 100 printable ASCII characters, no line break or
    control character (SNS API Reference, Publish); the body keeps the whole text."""
    note = build(NotificationKind.JOB_REFUSED, headline,
                 NotificationFacts(job_id=job_id, container_inst_id="e25f3e"))
    assert 0 < len(note.subject) < 100 and all(" " <= c <= "~" for c in note.subject), note.subject
    assert note.subject.startswith("[GPU recovery] ")
    assert headline in note.body and (job_id or "-") in note.body


def test_notification_carries_the_fault_evidence_and_plan_when_given() -> None:
    """Given the evidence and the remediation plan as detail lines, Then they close the e-mail;
    without them the body is as before."""
    from gpu_recovery.domain.evidence import Evidence, XidEvent
    from gpu_recovery.domain.fault_catalog import load_catalog
    from gpu_recovery.domain.fault_vocabulary import Trigger
    from gpu_recovery.domain.remediation_plan import RemediationPolicy, plan_remediation

    evidence = Evidence(node_id="ci-1", fault_at=1_734_220_000.0, trigger=Trigger.TASK_EXIT, job_id="llama",
                        rank=1, exit_code=1, xids=(XidEvent(79, "GPU-a", 1_734_219_990.0),))
    plan = plan_remediation(evidence, RemediationPolicy(catalog=load_catalog()), now=1_734_220_000.0)
    facts = NotificationFacts(job_id="llama", what_happened="rank 1 exited 1", what_was_done="rebooted",
                              operator_action="none", details=evidence.render_lines() + plan.render_lines())
    body = build(NotificationKind.RECOVERED, "Job recovered", facts).body
    assert body.index("What to do: none") < body.index("Details:")
    assert "  XIDs: 79 on GPU-a" in body and "  Decision: reboot (catalog rule 'xid-79'" in body
    plain = build(NotificationKind.RECOVERED, "Job recovered",
                  NotificationFacts(job_id="llama", operator_action="none")).body
    assert "Details:" not in plain and plain.endswith("What to do: none\n")
