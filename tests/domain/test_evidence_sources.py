"""Evidence has an owner (issue 49): the catalog's evidence_sources, what each may trigger alone,
enforced at validation (synth) and where a plan is made."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from gpu_recovery.domain.classify import classify
from gpu_recovery.domain.evidence import DcgmFindings, Evidence, build_evidence
from gpu_recovery.domain.evidence_sources import (
    DEFAULT_CATALOG_PATH,
    TENANT,
    TENANT_MAX_ACTION,
    sources_of,
    table_lines,
)
from gpu_recovery.domain.fault_catalog import CatalogError, FaultCatalog, default_catalog, load_catalog
from gpu_recovery.domain.fault_vocabulary import ACTION_SEVERITY, NODE_ACTIONS, Action, Trigger
from gpu_recovery.domain.remediation_plan import RemediationPolicy, plan_remediation

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


def _document() -> dict:
    return json.loads(DEFAULT_CATALOG_PATH.read_text())


def _preflight_evidence() -> Evidence:
    return build_evidence(node_id="n1", fault_at=NOW, trigger=Trigger.PREFLIGHT, instance_item=None,
                          job_id="j", attempt=1, rank=1, catalog=default_catalog())


def test_a_preflight_pin_leads_to_the_stacks_own_check_not_a_reboot_without_one() -> None:
    plan = plan_remediation(_preflight_evidence(), RemediationPolicy(catalog=default_catalog()), now=NOW)
    assert plan.action is Action.HEALTH_CHECK and not plan.decision.skip_health_check
    assert plan.decision.rule_id == "preflight-pinned" and not plan.needs_breaker


def test_after_the_check_its_verdict_decides_as_for_any_fault() -> None:
    for verdict, action in (("healthy", Action.RESTART_JOB), ("reboot", Action.REBOOT)):
        evidence = _preflight_evidence().with_dcgm(DcgmFindings.from_verdict_json({"verdict": verdict}), NOW)
        decision = classify(evidence, default_catalog())
        assert decision.action is action, verdict


@pytest.mark.parametrize("patch", [
    {"id": "preflight-pinned", "action": "reboot", "skip_health_check": True},
    {"id": "preflight-pinned", "action": "replace"},
    {"id": "exit-1-reboots", "match": {"trigger": ["task_exit"], "exit_code": [1]}, "action": "reboot",
     "skip_health_check": True, "description": "d", "source": "s"},
    {"id": "hang-quarantines", "match": {"trigger": ["hung"]}, "action": "operator_action",
     "description": "d", "source": "s"},
])
def test_an_override_asking_a_tenants_evidence_for_more_than_a_check_is_refused(patch: dict) -> None:
    with pytest.raises(CatalogError) as raised:
        load_catalog(override={"rules": [patch]})
    text = str(raised.value)
    assert patch["id"] in text and "tenant" in text and "at most health_check" in text


def test_a_rule_needing_the_nodes_own_word_too_may_act() -> None:
    # Conditions are all required: the node agent's XID backs the tenant's exit code.
    rule = {"id": "exit-1-with-xid-79", "match": {"trigger": ["task_exit"], "exit_code": [1], "xid": [79]},
            "action": "reboot", "skip_health_check": True, "description": "d", "source": "s"}
    assert load_catalog(override={"rules": [rule]}).rule("exit-1-with-xid-79").action is Action.REBOOT


def test_an_override_cannot_change_who_owns_evidence() -> None:
    sources = copy.deepcopy(_document()["evidence_sources"])
    for source in sources:
        source["max_action"] = "replace"
    with pytest.raises(CatalogError, match=r"evidence_sources.*cannot be overridden"):
        load_catalog(override={"evidence_sources": sources})


def test_a_catalog_whose_tenant_source_asks_for_more_is_refused() -> None:
    document = _document()
    for source in document["evidence_sources"]:
        if source["id"] == "tenant_preflight":
            source["max_action"] = "reboot"
    with pytest.raises(CatalogError, match="tenant's evidence may trigger at most health_check"):
        load_catalog(document)


def test_every_condition_and_trigger_has_exactly_one_owner() -> None:
    document = _document()
    document["evidence_sources"] = [s for s in document["evidence_sources"] if s["id"] != "tenant_progress"]
    with pytest.raises(CatalogError, match="no source owns the trigger 'hung'"):
        load_catalog(document)


def test_the_classification_caps_a_rule_that_got_past_the_validation() -> None:
    """Defense in depth where the plan is made: a document built without validation."""
    document = _document()
    for rule in document["rules"]:
        if rule["id"] == "preflight-pinned":
            rule.update(action="reboot", skip_health_check=True)
    catalog = FaultCatalog.from_document(document)
    plan = plan_remediation(_preflight_evidence(), RemediationPolicy(catalog=catalog), now=NOW)
    assert plan.action is Action.HEALTH_CHECK and not plan.decision.skip_health_check
    assert any("at most health_check" in note for note in plan.decision.notes)


def test_no_default_rule_on_tenant_evidence_alone_repairs_or_skips_the_check() -> None:
    catalog = default_catalog()
    sources = catalog.evidence_sources
    for rule in catalog.rules:
        held = sources.of_match(rule.match.conditions())
        if held and all(s.owner == TENANT for s in held):
            assert rule.action not in NODE_ACTIONS and not rule.skip_health_check, rule.id
    assert all(ACTION_SEVERITY[s.max_action] <= ACTION_SEVERITY[TENANT_MAX_ACTION]
               for s in sources.sources if s.owner == TENANT)


def test_docs_table_what_each_kind_of_evidence_may_do_alone_matches_the_data() -> None:
    doc = (REPO / "docs" / "remediation.md").read_text()
    found = re.search(r"<!-- evidence sources table:[^\n]*-->\n(.*?)\n<!-- end of evidence sources table -->",
                      doc, re.S)
    assert found is not None
    assert found.group(1).splitlines() == table_lines(sources_of({}))
