"""The grants the simulated runs are held to (local_mode/sim/contract/grants.json) are the
synthesized template's, and the grants that issue 40's defects lacked are there."""

from __future__ import annotations

import difflib
import json
from typing import Any

from infra_synth import Synth, statement_actions, statement_resources

from local_mode.sim.contract import grants_file


def _lines(content: dict[str, Any]) -> list[str]:
    return grants_file.render_file(content).splitlines()


def test_the_committed_grants_file_is_the_templates(default_synth: Synth, custom_synth: Synth) -> None:
    """Every function's role statements and platform needs from the default synthesis, and
    the replace_action=terminate_in_asg grants from the custom one (its Auto Scaling
    statements, with the instance tag as placeholders): the committed file, exactly."""
    content = grants_file.from_stack(default_synth.stack, default_synth.template)
    content["variants"] = {"replace_action=terminate_in_asg": grants_file.variant_statements(
        "replace_action=terminate_in_asg", custom_synth.stack, custom_synth.template)}
    committed = grants_file.read()
    if content != committed:
        diff = "\n".join(list(difflib.unified_diff(_lines(committed), _lines(content), "committed",
                                                   "template", lineterm=""))[:80])
        raise AssertionError(f"grants.json differs from the template: run `{grants_file.REGENERATE}`\n{diff}")


def _function_statements(synth: Synth, handler_module: str) -> list[dict[str, Any]]:
    return grants_file.from_stack(synth.stack, synth.template)["functions"][handler_module]["statements"]


def test_list_tasks_is_granted_on_star_in_the_cluster_only(default_synth: Synth) -> None:
    """Defect 3: a ListTasks naming no container instance is authorized against ``*``."""
    found = 0
    for policy in default_synth.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if "ecs:ListTasks" in statement_actions(statement):
                found += 1
                assert statement_resources(statement) == ["*"], statement
                assert statement["Condition"] == {"ArnEquals": {
                    "ecs:cluster": "arn:aws:ecs:us-east-1:111122223333:cluster/gpu-cluster"}}
    assert found == 9  # the recovery functions, gang and tag-lookup workers, node API, sweep, scheduler


def test_the_instance_monitor_and_the_node_api_may_put_placement_attributes(default_synth: Synth) -> None:
    """Defect 4: both put the spare / reserved / cordon attributes (a node wholly free
    becomes a spare; a node back after its reboot releases its holds), in the cluster only."""
    for module in ("ecs_instance_monitor", "node_api"):
        (statement,) = [s for s in _function_statements(default_synth, module)
                        if "ecs:PutAttributes" in s.get("Action", [])]
        assert statement["Action"] == ["ecs:PutAttributes", "ecs:DeleteAttributes"]
        assert statement["Resource"] == ["arn:aws:ecs:${region}:${account}:container-instance/${cluster}/*"]
        assert json.dumps(statement["Condition"]) == json.dumps(
            {"ArnEquals": {"ecs:cluster": "arn:aws:ecs:${region}:${account}:cluster/${cluster}"}})
