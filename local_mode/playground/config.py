"""The playground's settings (``python -m local_mode.playground`` options), the task
definitions it registers, and the error a request or an option is refused with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpu_recovery.domain.reboot_evidence import REBOOT_MIN_OUTAGE_SECONDS
from gpu_recovery.domain.validation import ValidationError, ValidationPolicy

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
# Task definitions the CLI's documentation submits besides the examples' (cli/README.md).
DOCUMENTED_TASK_DEFINITIONS = {"bert-train": 7}
# SimulatedEcs: tasks killed 5 s, agent down 15 s after the request; the agent must then stay
# away as long as a reboot does for the recovery loop to take it for one (without a node
# agent reporting the boot time, domain.reboot_evidence).
MIN_REBOOT_SECONDS = 15 + int(REBOOT_MIN_OUTAGE_SECONDS)
# The validation-after-repair keys a --setting may give (docs/configuration.md); the others
# are remediation settings.
VALIDATION_KEYS = ("validate_after_repair", "validation_dcgm_level", "validation_load_seconds",
                   "validation_timeout_minutes")


class PlaygroundError(Exception):
    """A request the playground refuses: HTTP ``status``, the field at fault."""

    def __init__(self, message: str, *, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status



@dataclass
class PlaygroundConfig:
    nodes: int = 4
    gpus_per_node: int = 8
    speed: float = 1.0
    port: int = 8080
    aws_port: int = 8081
    run_minutes: float = 10.0
    reboot_seconds: float = 180.0
    dcgm_seconds: float = 120.0
    duplicate_delivery: bool = True
    verbose: bool = False
    examples_dir: Path = EXAMPLES_DIR
    # The deployment's remediation and validation settings (docs/configuration.md keys), over
    # the defaults (validation after repair on, as a deployment's).
    settings: dict[str, str] = field(default_factory=dict)

    def validate(self) -> PlaygroundConfig:
        checks = (
            ("nodes", 1 <= self.nodes <= 64, "1..64"),
            ("gpus", 1 <= self.gpus_per_node <= 16, "1..16"),
            ("speed", 0 < self.speed <= 1000, "above 0, at most 1000"),
            ("port", 0 <= self.port <= 65535, "0..65535"),
            ("aws_port", 0 <= self.aws_port <= 65535, "0..65535"),
            ("run_minutes", 0 < self.run_minutes <= 7 * 24 * 60, "above 0, at most a week"),
            # The simulated agent disconnects 15 s after the reboot request: a node back before
            # that would never be seen going down, one back too soon after looks like a blip
            # (the recovery would wait for it in vain).
            ("reboot_seconds", MIN_REBOOT_SECONDS <= self.reboot_seconds <= 3600,
             f"{MIN_REBOOT_SECONDS}..3600"),
            ("dcgm_seconds", 5 <= self.dcgm_seconds <= 3600, "5..3600"),
        )
        for option, ok, accepted in checks:
            if not ok:
                value = getattr(self, "gpus_per_node" if option == "gpus" else option)
                raise ValueError(f"--{option.replace('_', '-')}: {value:g} is not {accepted}")
        if self.port and self.port == self.aws_port:
            raise ValueError("--port and --aws-port must differ")
        if self.remediation_settings:
            from gpu_recovery.domain.remediation_settings import parse_remediation_settings

            try:
                parse_remediation_settings(self.remediation_settings)
            except ValueError as error:
                raise ValueError(f"--setting: {error}") from None
        self.validation()
        return self

    @property
    def remediation_settings(self) -> dict[str, str]:
        return {k: v for k, v in self.settings.items() if k not in VALIDATION_KEYS}

    def validation(self) -> ValidationPolicy:
        """Validation after repair as the settings give it (on by default, as deployed)."""
        given = {k: v.strip().lower() for k, v in self.settings.items() if k in VALIDATION_KEYS}
        defaults = ValidationPolicy(enabled=True)
        try:
            enabled = given.get("validate_after_repair", "true")
            if enabled not in ("true", "false"):
                raise ValidationError(f"validate_after_repair must be true or false, got {enabled!r}")
            return ValidationPolicy(
                enabled=enabled == "true",
                dcgm_level=int(given.get("validation_dcgm_level", defaults.dcgm_level)),
                load_seconds=int(given.get("validation_load_seconds", defaults.load_seconds)),
                timeout_seconds=60 * int(given.get("validation_timeout_minutes",
                                                   defaults.timeout_seconds // 60)))
        except ValueError as error:
            raise ValueError(f"--setting: {error}") from None

    @property
    def run_seconds(self) -> float:
        return self.run_minutes * 60


def example_task_definitions(examples_dir: Path) -> dict[str, int]:
    """family -> highest revision named by ``task_definition`` in ``examples_dir/*.yaml``
    (``family`` alone counts as revision 1; an ARN is read as its ``family:revision``)."""
    import yaml

    found: dict[str, int] = {}
    for path in sorted(examples_dir.glob("*.y*ml")):
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        ref = str((doc or {}).get("task_definition") or "") if isinstance(doc, dict) else ""
        ref = ref.rsplit("/", 1)[-1]
        if not ref:
            continue
        family, _, revision = ref.partition(":")
        found[family] = max(found.get(family, 0), int(revision) if revision.isdigit() else 1)
    return found
