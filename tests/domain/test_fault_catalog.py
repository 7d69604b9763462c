"""The fault catalog as data: the shipped defaults, validation messages, per-deployment overrides."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpu_recovery.domain.fault_catalog import (
    DEFAULT_CATALOG_PATH,
    CatalogError,
    load_catalog,
    merge_override,
    read_catalog_file,
    validate_catalog,
)
from gpu_recovery.domain.fault_vocabulary import Action, Budget

REPO = Path(__file__).resolve().parents[2]
# EKS node monitoring agent's fatal XIDs (remediation-anchors.md §1).
EKS_FATAL_XIDS = {46, 48, 54, 62, 63, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142, 143, 151, 155,
                  156, 158}


def default_document() -> dict:
    return json.loads(DEFAULT_CATALOG_PATH.read_text())


def xid_rule(catalog, xid):
    rules = [r for r in catalog.rules if xid in r.match.xids]
    assert len(rules) == 1, (xid, [r.id for r in rules])
    return rules[0]


# --- the shipped catalog --------------------------------------------------------------


def test_default_catalog_ships_in_the_lambda_asset_and_is_valid() -> None:
    assert DEFAULT_CATALOG_PATH.is_relative_to(REPO / "lambdas")
    assert validate_catalog(default_document()) == []
    catalog = load_catalog()
    assert len(catalog.rules) == len(default_document()["rules"])


def test_every_default_rule_names_its_source_and_what_it_means() -> None:
    for rule in load_catalog().rules:
        assert rule.source.strip() and rule.description.strip(), rule.id
        if rule.match.xids:
            assert rule.nvidia_bucket, f"{rule.id}: XID rules carry NVIDIA's bucket"


def test_every_xid_eks_calls_fatal_has_a_rule() -> None:
    covered = set().union(*(r.match.xids for r in load_catalog().rules))
    assert covered >= EKS_FATAL_XIDS


@pytest.mark.parametrize("xid", [13, 31, 43, 94])
def test_application_xids_need_a_repeat_on_the_same_gpu_within_24h_for_a_diag(xid: int) -> None:
    rule = xid_rule(load_catalog(), xid)
    assert rule.action is Action.APPLICATION_ERROR and rule.budget is Budget.APPLICATION
    assert rule.repeat is not None
    assert (rule.repeat.count, rule.repeat.window_seconds, rule.repeat.same_gpu, rule.repeat.action) == (
        2, 24 * 3600, True, Action.HEALTH_CHECK)


@pytest.mark.parametrize(("xid", "action"), [(79, Action.REBOOT), (48, Action.RESET_GPU),
                                             (95, Action.RESET_GPU), (64, Action.REPLACE)])
def test_definitive_xids_skip_the_diag(xid: int, action: Action) -> None:
    rule = xid_rule(load_catalog(), xid)
    assert rule.action is action and rule.skip_health_check


@pytest.mark.parametrize("xid", [63, 92])
def test_informational_xids_do_nothing(xid: int) -> None:
    assert xid_rule(load_catalog(), xid).action is Action.NONE


def test_nvidia_smi_and_dcgm_rows_follow_the_anchors() -> None:
    catalog = load_catalog()
    assert catalog.rule("gpu-remap-pending").action is Action.RESET_GPU
    assert catalog.rule("gpu-recovery-action-reset").action is Action.RESET_GPU
    assert catalog.rule("gpu-recovery-action-reboot").action is Action.REBOOT
    assert catalog.rule("gpu-retirement-pending").action is Action.REBOOT
    assert catalog.rule("dcgm-verdict-reset").match.dcgm_verdicts == {"reset"}
    assert catalog.rule("gpu-remap-failure").action is Action.REPLACE
    assert catalog.rule("gpu-ecc-uncorrected").action is Action.REBOOT
    assert catalog.rule("gpu-fallen-off-bus").action is Action.REBOOT
    persistence = catalog.rule("dcgm-error-29-persistence-mode")
    assert persistence.action is Action.OPERATOR_ACTION and 29 in persistence.match.dcgm_error_ids
    assert catalog.rule("exit-suspect").match.exit_code_suspect
    assert catalog.rule("exit-suspect").action is Action.HEALTH_CHECK


# --- validation messages ------------------------------------------------------------------


def broken(mutate) -> list[str]:
    document = default_document()
    mutate(document)
    return validate_catalog(document)


def test_errors_name_the_rule_and_the_field() -> None:
    def mutate(d):
        d["rules"][13]["action"] = "rebot"
        d["rules"][14]["skip_health_chek"] = True
        d["rules"][15]["match"] = {"xid": [0, "79"]}
    errors = broken(mutate)
    ids = [default_document()["rules"][i]["id"] for i in (13, 14, 15)]
    assert any(e.startswith(f"rules[13] (id '{ids[0]}'): field 'action'") and "'rebot'" in e for e in errors)
    assert any(e.startswith(f"rules[14] (id '{ids[1]}'): unknown field 'skip_health_chek'") for e in errors)
    assert any(e.startswith(f"rules[15] (id '{ids[2]}'): field 'match.xid'") and '"79"' in e for e in errors)
    assert len(errors) == 3


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"match": {"xid": [13]}, "action": "application_error", "skip_health_check": True},
         "only a rule whose action is"),
        ({"match": {"dcgm_verdict": ["reboot"]}, "action": "reboot", "skip_health_check": True},
         "cannot skip it"),
        ({"match": {"dcgm_verdict": ["reboot"]}, "action": "health_check"}, "it would loop"),
        ({"match": {"gpu_signal": ["remap_pending"]}, "action": "reboot",
          "repeat": {"count": 2, "window_hours": 24, "action": "replace"}}, "needs an 'xid' condition"),
        ({"match": {"xid": [13]}, "action": "application_error",
          "repeat": {"count": 1, "window_hours": 0, "scope": "gpu", "action": "x"}},
         "repeat.count"),
        ({"match": {"exit_code": "sometimes"}, "action": "health_check"}, "\"suspect\""),
        ({"match": {"exit_code": [0]}, "action": "health_check"}, "exit codes 1..255"),
        ({"match": {"gpu_signal": ["fell_off"]}, "action": "reboot"}, "fallen_off_bus"),
        ({"match": {"dcgm_severity": ["fatal"]}, "action": "replace"}, "isolate"),
        ({"match": {"trigger": ["cron"]}, "action": "health_check"}, "node_lost"),
        ({"match": {"colour": ["red"]}, "action": "reboot"}, "unknown condition 'colour'"),
        ({"match": {}, "action": "reboot"}, "at least one condition"),
        ({"match": {"xid": [13]}, "action": "reboot", "budget": "job"}, "field 'budget'"),
        ({"match": {"xid": [13]}, "action": "reboot", "priority": 1000}, "field 'priority'"),
    ],
)
def test_invalid_rules_are_explained(rule: dict, expected: str) -> None:
    document = {"schema_version": 1, "rules": [
        {"id": "mine", "description": "d", "source": "s", **rule}]}
    errors = validate_catalog(document)
    assert errors and all(e.startswith("rules[0] (id 'mine')") for e in errors), errors
    assert any(expected in e for e in errors), errors


def test_repeat_problems_are_each_reported() -> None:
    errors = validate_catalog({"schema_version": 1, "rules": [
        {"id": "mine", "description": "d", "source": "s", "match": {"xid": [13]},
         "action": "application_error",
         "repeat": {"count": 1, "window_hours": 0, "scope": "gpu", "action": "x", "every": 2}}]})
    for field in ("repeat.count", "repeat.window_hours", "repeat.scope", "repeat.action", "'every'"):
        assert any(field in e for e in errors), (field, errors)


def test_missing_source_duplicate_ids_and_matches_are_reported() -> None:
    rule = {"id": "a", "description": "d", "source": "", "match": {"xid": [13]}, "action": "none"}
    errors = validate_catalog({"schema_version": 1, "rules": [rule, {**rule, "source": "s"}]})
    assert any("rules[0] (id 'a'): field 'source' is required" in e for e in errors)
    assert any("rules[1] (id 'a'): duplicate id, also rules[0]" in e for e in errors)
    assert any("rules[1] (id 'a'): field 'match': same conditions as rule 'a'" in e for e in errors)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ([], "must be a JSON object"),
        ({"rules": []}, "schema_version"),
        ({"schema_version": 1, "rules": []}, "rules must be a non-empty list"),
        ({"schema_version": 1, "rules": [{"id": "Bad Id!"}]}, "field 'id'"),
        ({"schema_version": 1, "rules": ["x"]}, "rules[0]: must be an object"),
        ({"schema_version": 1, "extra": 1, "rules": []}, "unknown top-level field 'extra'"),
        ({"schema_version": 1, "defaults": {"unmatched_action": "reboot!"}, "rules": []}, "unmatched_action"),
        ({"schema_version": 1, "defaults": {"evidence_lookback_seconds": -1}, "rules": []},
         "evidence_lookback_seconds"),
    ],
)
def test_invalid_documents_are_explained(document, expected: str) -> None:
    assert any(expected in e for e in validate_catalog(document)), validate_catalog(document)


def test_load_raises_with_every_error_and_the_file_name(tmp_path) -> None:
    document = default_document()
    document["rules"][0]["action"] = "nap"
    document["rules"][1]["source"] = ""
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CatalogError) as raised:
        load_catalog(path)
    assert len(raised.value.errors) == 2
    assert str(path) in str(raised.value) and "'nap'" in str(raised.value)


def test_json_syntax_errors_say_where(tmp_path) -> None:
    path = tmp_path / "catalog.json"
    path.write_text('{"schema_version": 1,\n "rules": [}')
    with pytest.raises(CatalogError, match="line 2 column"):
        load_catalog(path)
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "missing.json")


# --- per-deployment overrides -----------------------------------------------------------------


def test_override_patches_adds_and_removes_rules(tmp_path) -> None:
    """Given an override that makes XID 13 a health check, adds an NCCL-timeout rule, drops
    the XID 92 rule and widens the evidence window,
    When merged onto the defaults,
    Then each change is in the loaded catalog and everything else is untouched."""
    override = {
        "schema_version": 1,
        "defaults": {"evidence_lookback_seconds": 1800},
        "rules": [
            {"id": "xid-13", "action": "health_check", "source": "site policy: diag every XID 13"},
            {"id": "site-nccl-timeout", "match": {"trigger": ["task_exit"], "exit_code": [134],
                                                  "stopped_reason_contains": ["NCCL"]},
             "action": "restart_job", "priority": 1, "description": "NCCL watchdog abort",
             "source": "site runbook"},
        ],
        "remove_rules": ["xid-92"],
    }
    path = tmp_path / "override.json"
    path.write_text(json.dumps(override))
    catalog = load_catalog(None, path)
    assert catalog.rule("xid-13").action is Action.HEALTH_CHECK
    assert catalog.rule("xid-13").repeat is not None  # fields not given are kept
    assert catalog.rule("site-nccl-timeout").match.exit_codes == {134}
    with pytest.raises(KeyError):
        catalog.rule("xid-92")
    assert catalog.lookback_seconds == 1800 and catalog.lookahead_seconds == 120
    assert catalog.rule("xid-79") == load_catalog().rule("xid-79")


def test_the_functions_read_json_and_refuse_a_yaml_path_naming_the_synth_time_reader(tmp_path) -> None:
    """YAML overrides are read at synthesis (tests/infra/test_infra_catalog_file.py); the
    domain, which imports nothing outside the standard library, reads JSON."""
    path = tmp_path / "override.yaml"
    path.write_text("schema_version: 1\nrules:\n  - id: xid-63\n    action: reboot\n")
    with pytest.raises(CatalogError, match=r"infra\.catalog_file"):
        load_catalog(None, path)


def test_override_errors_name_the_override(tmp_path) -> None:
    base = default_document()
    merged, errors = merge_override(base, {
        "rules": [{"id": "new-rule", "action": "reboot"}, {"action": "none"}],
        "remove_rules": ["no-such-rule"], "colour": "red", "schema_version": 2})
    assert any("override rules[1]" in e and "'id'" in e for e in errors)
    assert any("no-such-rule" in e for e in errors)
    assert any("unknown top-level field 'colour'" in e for e in errors)
    assert any("schema_version 2" in e for e in errors)
    # the incomplete new rule is caught when the merged catalog is validated
    assert any("(id 'new-rule')" in e and "'match'" in e for e in validate_catalog(merged))
    assert base == default_document()  # the base is not modified
    with pytest.raises(CatalogError, match="with override"):
        load_catalog(None, {"rules": [{"id": "xid-79", "skip_health_check": "yes"}]})


def test_dict_input_is_not_modified_and_the_document_is_kept() -> None:
    document = default_document()
    before = copy.deepcopy(document)
    catalog = load_catalog(document)
    assert document == before
    assert catalog.document == before
    assert read_catalog_file(DEFAULT_CATALOG_PATH) == before


def test_the_documentation_lists_every_default_rule_with_its_action() -> None:
    """docs/fault-catalog.md stays true: one table row per default rule, same action."""
    doc = (REPO / "docs" / "fault-catalog.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[3].strip()
            for line in doc.splitlines() if line.startswith("| `")}
    for rule in default_document()["rules"]:
        assert rows.get(rule["id"]) == rule["action"], rule["id"]


def test_every_reset_gpu_xid_rule_follows_nvidias_reset_bucket() -> None:
    """reset_gpu for an XID only where NVIDIA's immediate action says so (RESET_GPU), or its
    XID 48 workflow (NVSentinel maps it to a component reset); XID 64's remap failure stays a
    replacement."""
    for rule in load_catalog().rules:
        if rule.action is Action.RESET_GPU and rule.match.xids:
            assert rule.nvidia_bucket in ("RESET_GPU", "WORKFLOW_XID_48"), rule.id
        if rule.nvidia_bucket == "RESET_GPU" and rule.id != "xid-64":
            assert rule.action is Action.RESET_GPU, rule.id
    assert load_catalog().rule("xid-64").action is Action.REPLACE
