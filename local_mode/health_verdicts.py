"""What a simulated node's DCGM health check finds (both simulators share it): node health
values, the health check's exit code for each, and the JSON verdict line it prints."""

from __future__ import annotations

import json

HEALTH_VALUES = ("healthy", "reboot_fixable", "persistent_reboot", "replace", "config_error")
# config_error: DCGM's persistence-mode failure (error 29, severity config): exit 3.
VERDICT_EXIT = {"healthy": 0, "reboot_fixable": 1, "persistent_reboot": 1, "replace": 2,
                "config_error": 3}


def verdict_line(verdict: int, dcgm_level: int, gpu_ids: list[str], hostname: str) -> str:
    """The JSON verdict line health_check/dcgm_health_check.sh prints (see its README) for
    exit code ``verdict`` (0 healthy, 1 reboot, 2 replace, 3 operator action)."""
    name = {0: "healthy", 1: "reboot", 2: "replace", 3: "operator_action"}[verdict]
    reasons = {
        "healthy": [],
        "reboot": ["dcgmi diag failed (exit 226)", "gpu 3: 2 uncorrected volatile ECC errors"],
        "replace": ["dcgmi diag reported an isolate error (exit 205)"],
        "operator_action": ["dcgmi diag failed (exit 226) on configuration problems only"],
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
    return json.dumps(
        {
            "verdict": name,
            "exit_code": verdict,
            "dcgm_level": dcgm_level,
            "dcgmi_exit_code": {0: 0, 1: 226, 2: 205, 3: 226}[verdict],
            "failed_tests": {0: [], 3: ["software"]}.get(verdict, ["memory"]),
            "errors": errors,
            "gpus": [{"index": i, "uuid": gpu} for i, gpu in enumerate(gpu_ids)],
            "reasons": reasons,
            "notes": [],
            "hostname": hostname,
        }
    )
