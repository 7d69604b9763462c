"""Suite-wide set-up: the emulator's CPU-only speedups for every test that uses moto, the
emulator's own tests and those that start ``mock_aws`` themselves alike (same responses;
``local_mode.emulator.install_emulator_speedups``)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    from local_mode.emulator import install_emulator_speedups

    install_emulator_speedups()
