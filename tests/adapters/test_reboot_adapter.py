"""The reboot adapter sends the stack's reboot-only document (no parameters), never
AWS-RunShellScript with a command."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery.adapters.compute import RebootAdapter
from gpu_recovery.constants import DEFAULT_REBOOT_DOCUMENT_NAME, ENV_REBOOT_DOCUMENT
from gpu_recovery.settings import Settings


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def send_command(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("send_command", kwargs))
        return {}

    def reboot_instances(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("reboot_instances", kwargs))
        return {}


def test_managed_instance_is_rebooted_with_the_reboot_only_document() -> None:
    ssm, ec2 = Recorder(), Recorder()
    assert RebootAdapter(ec2, ssm, "Stack-RebootDocument-ABC").reboot("mi-0123", "fault") == "ssm"
    ((name, kwargs),) = ssm.calls
    assert name == "send_command" and kwargs["DocumentName"] == "Stack-RebootDocument-ABC"
    assert "Parameters" not in kwargs and kwargs["InstanceIds"] == ["mi-0123"]
    assert RebootAdapter(ec2, ssm).reboot("i-0123", "fault") == "ec2" and ec2.calls
    with pytest.raises(ValueError):
        RebootAdapter(ec2, ssm).reboot("host-1", "fault")


def test_settings_carry_the_document_name() -> None:
    env = {"TRAINING_JOB_TABLE_NAME": "j", "CONTAINER_INSTANCE_TABLE_NAME": "i", "ECS_CLUSTER_NAME": "c"}
    assert Settings.from_env(env).reboot_document == DEFAULT_REBOOT_DOCUMENT_NAME
    assert Settings.from_env({**env, ENV_REBOOT_DOCUMENT: "Doc-1"}).reboot_document == "Doc-1"
