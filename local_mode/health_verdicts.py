"""What a simulated node's DCGM health check finds (both simulators share it): node health
values, the health check's exit code for each, and the JSON verdict line it prints."""

from __future__ import annotations

import json

#: The log group the health-check task definition's awslogs driver writes to.
HEALTH_CHECK_LOG_GROUP = "/ecs/gpu-health-check"
HEALTH_VALUES = ("healthy", "reboot_fixable", "persistent_reboot", "replace", "config_error",
                 "reset_fixable", "reset_fails")
# config_error: DCGM's persistence-mode failure (error 29, severity config): exit 3.
# reset_fixable: a row remap pending after an uncorrectable ECC error (the driver's recovery
# action Drain and Reset): the check exits 4, a GPU reset (or a reboot) clears it.
# reset_fails: the same evidence, but the GPU reset task fails on the node (a reboot clears it).
VERDICT_EXIT = {"healthy": 0, "reboot_fixable": 1, "persistent_reboot": 1, "replace": 2,
                "config_error": 3, "reset_fixable": 4, "reset_fails": 4}
# Health a GPU reset clears (the reset task exits 0 and the node is healthy); any other
# faulty health makes the reset task exit 1 (its diag fails) and stays for the reboot.
RESET_FIXES = frozenset({"healthy", "reset_fixable"})
# Health a reboot clears.
REBOOT_FIXES = frozenset({"reboot_fixable", "reset_fixable", "reset_fails"})


def verdict_line(verdict: int, dcgm_level: int, gpu_ids: list[str], hostname: str, *,
                 load_seconds: int = 0, load_failed: bool = False) -> str:
    """The JSON verdict line health_check/dcgm_health_check.sh prints (see its README) for
    exit code ``verdict`` (0 healthy, 1 reboot, 2 replace, 3 operator action, 4 reset).
    ``load_seconds``: a validation's GPU load ran (``load``); ``load_failed``: it, not the
    diag, found the fault (DCGM_FR_STRESS_LEVEL on GPU 0, as fixtures/dcgmi_targeted_stress_fail)."""
    name = {0: "healthy", 1: "reboot", 2: "replace", 3: "operator_action", 4: "reset"}[verdict]
    reasons = {
        "healthy": [],
        "reboot": ["dcgmi diag failed (exit 226)", "gpu 3: 2 uncorrected volatile ECC errors"],
        "replace": ["dcgmi diag reported an isolate error (exit 205)"],
        "operator_action": ["dcgmi diag failed (exit 226) on configuration problems only"],
        "reset": ["gpu 0: row remap pending (a GPU reset applies it)"],
    }[name]
    # As the real DCGM 4.x capture: persistence mode off is error 29, severity 5 (config),
    # category 3 (software config), and makes dcgmi exit 226 like a failed test.
    errors = {
        "reboot": [{"test": "memory", "error_id": 2, "severity": 4, "category": 10,
                    "message": "Memory test failed: 2 uncorrected volatile ECC errors on GPU 3"}],
        "replace": [{"test": "memory", "error_id": 70, "severity": 2, "category": 10,
                     "message": "A row remapping failure occurred on GPU 0"}],
        "operator_action": [{"test": "software", "error_id": 29, "severity": 5, "category": 3,
                             "message": "Persistence mode for GPU 0 is disabled. Enable "
                                        "persistence mode by running \"nvidia-smi -i 0 -pm 1\""}],
    }.get(name, [])
    load = None
    failed_tests = {0: [], 3: ["software"], 4: []}.get(verdict, ["memory"])
    if load_seconds:
        load = {"test": "targeted_stress", "seconds": load_seconds,
                "dcgmi_exit_code": {0: 0, 2: 205}.get(verdict, 226) if load_failed else 0}
    if load_failed:
        failed_tests = ["targeted_stress"]
        exit_code = load["dcgmi_exit_code"] if load else 226
        reasons = [f"GPU load (targeted_stress, {load_seconds} s) failed (exit {exit_code})"]
        errors = [{"test": "targeted_stress", "error_id": 50, "severity": 1, "category": 1,
                   "message": "Max stress level of 412.3 did not reach desired stress level of 1100.0 "
                              "for GPU 0"}]
    return json.dumps(
        {
            "verdict": name,
            "exit_code": verdict,
            "dcgm_level": dcgm_level,
            "dcgmi_exit_code": 0 if load_failed else {0: 0, 1: 226, 2: 205, 3: 226, 4: 0}[verdict],
            "failed_tests": failed_tests,
            "errors": errors,
            "gpus": [{"index": i, "uuid": gpu,
                      **({"remap_pending": True, "recovery_action": "drain_and_reset"}
                         if verdict == 4 and i == 0 else {})} for i, gpu in enumerate(gpu_ids)],
            "load": load,
            "reasons": reasons,
            "notes": [],
            "hostname": hostname,
        }
    )
