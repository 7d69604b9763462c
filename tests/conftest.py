"""Suite-wide set-up.

* The emulator's CPU-only speedups for every test that uses moto, the emulator's own tests
  and those that start ``mock_aws`` themselves alike (same responses;
  ``local_mode.moto_patches.install_emulator_speedups``).
* A request AWS would refuse fails the test that made it (``_no_request_aws_would_refuse``).
* The grants guard (``local_mode.sim.contract.grants``): a test during which a Lambda
  function made an AWS call its role does not allow fails, even if the code swallowed the
  error; with ``GRANTS_USAGE_DIR`` set, each process writes what the guards allowed there at
  the end (``python -m local_mode.sim.contract grants --unused DIR`` reads it).
* Two tiers (docs/testing.md): ``make test`` runs ``pytest --quick``, which leaves out the
  tests marked ``slow`` and does not even collect the modules in ``SLOW_MODULES`` (their
  parametrization runs whole recoveries at collection); ``make test-all`` runs everything.
* The garbage collector's thresholds raised (``GC_THRESHOLDS``) for the test processes only.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

#: The emulated clusters allocate heavily and keep much alive within a test: with Python's
#: defaults (700, 10, 10) a full collection ran every couple of seconds. tests/recovery,
#: tests/queue_scheduler and tests/time_sharing in one process spent 52 s of 169 s collecting
#: (103 full collections); with these, 17 s of 134 s (3). The test processes only: the Lambda
#: code and the demo keep the defaults.
GC_THRESHOLDS = (20_000, 20, 50)
gc.set_threshold(*GC_THRESHOLDS)

#: set to "quick" under --quick, before collection (a module's parametrization may read it)
TIER_ENV = "GPU_RECOVERY_TEST_TIER"

#: whole modules of the slow tier, each a campaign or scenario that ``make test`` covers more
#: cheaply elsewhere (docs/testing.md, "The two tiers")
SLOW_MODULES = (
    # every flow but the GPU fault broken at every call site (make test-campaigns: at every
    # call); stage tests, tests/remediation, tests/time_sharing and tests/recovery/test_fanout.py
    # cover the flows in make test, and the GPU-fault campaign stays in it
    "crash_consistency/test_flows.py",
    # every flow with 1 % of its calls failing, two seeds (issue 49: no false repair); the
    # quick tier's tests/local_mode/test_false_repairs.py checks the figure and the switch
    "crash_consistency/test_calls_failing.py",
    # `make demo`'s whole run (~2 min): its scenarios are tested one by one elsewhere
    "local_mode/test_demo.py",
    # the demo's time-sharing scenario (tests/time_sharing/test_preemption_flow.py: graceful
    # preemption and resume; tests/control: rank 0's client)
    "local_mode/test_time_sharing_demo.py",
)


#: pages whose runnable blocks run in the slow tier only (tests/docs/test_doc_blocks.py), each
#: with why. None: every page's blocks run in make test (issue 42: the documentation is
#: executed where a newcomer's test command runs it), and are checked for syntax and names.
SLOW_DOC_PAGES: dict[str, str] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="make test's tier: leave out the slow tier (SLOW_MODULES and tests marked slow)")


def pytest_configure(config: pytest.Config) -> None:
    from local_mode import world
    from local_mode.moto_patches import compare_missing_attributes_as_dynamodb_does, install_emulator_speedups

    config.addinivalue_line("markers", "slow: the slow tier, left out by --quick (make test)")
    config.addinivalue_line("markers", "campaign: a crash campaign's test (tests/crash_consistency; added "
                                       "to each by tests/conftest.py)")
    config.addinivalue_line("markers", "long: minutes on one core; its xdist group is handed out first")
    install_emulator_speedups()
    # The worlds' DynamoDB is the in-memory store (the crash campaigns' and the soak's), a
    # fraction of moto's CPU per call: make test takes about a fifth less time. moto's stays
    # under the tests that pin it (dynamodb="moto", LocalAws or mock_aws entered themselves,
    # but the stage worlds of tests/recovery/fakes.py: the store, tests/repository's aside),
    # the demo's tests, the playground and the documentation's blocks. The two are held to the
    # same answers (tests/local_mode/test_memory_backend.py) and, in the slow tier, to the same
    # calls and end of a whole recovery (test_the_in_memory_dynamodb_runs_the_flow_exactly_as_moto).
    world.DEFAULT_DYNAMODB = "memory"
    compare_missing_attributes_as_dynamodb_does()  # every test's moto, not only the emulator's
    if config.getoption("--quick"):
        os.environ[TIER_ENV] = "quick"


@pytest.fixture(autouse=True)
def _no_request_aws_would_refuse() -> Iterator[None]:
    """Issue 40: a request AWS would refuse, made anywhere in a test (the request guard of
    every LocalAws and scale world, local_mode/sim/contract/requests.py), fails the test even
    when the code under test caught the error."""
    from local_mode.sim.contract.requests import recorded, recorded_since

    mark = recorded()
    yield
    found = recorded_since(mark)
    if found:
        pytest.fail("requests AWS would refuse:\n  " + "\n  ".join(str(v) for v in found), pytrace=False)


@pytest.fixture(autouse=True)
def _no_call_refused_by_its_role() -> Iterator[None]:
    """Fail the test when a handler made a call its function's role does not grant."""
    from local_mode.sim.contract.grants import recorded_denials

    before = len(recorded_denials())
    yield
    denied = recorded_denials()[before:]
    if denied and os.environ.get("GRANTS_USAGE_DIR"):  # a survey: each denial kept as it happens
        Path(os.environ["GRANTS_USAGE_DIR"]).mkdir(parents=True, exist_ok=True)
        with open(Path(os.environ["GRANTS_USAGE_DIR"]) / f"denials-{os.getpid()}.txt", "a") as out:
            out.writelines(f"{d}\n" for d in denied)
    if denied:
        pytest.fail("a Lambda function made AWS calls its role does not grant (what AWS refuses):\n"
                    + "\n".join(sorted({f"  {d}" for d in denied})), pytrace=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("GRANTS_USAGE_DIR")
    if target:
        from local_mode.sim.contract.usage import write_usage

        write_usage(Path(target))


def in_slow_module(path: Path) -> bool:
    return path.is_relative_to(TESTS) and path.relative_to(TESTS).as_posix() in SLOW_MODULES


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return True if config.getoption("--quick") and in_slow_module(collection_path) else None


def group_by_module(items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` a test with no ``xdist_group`` is handed out on its own,
    so a module's tests land on both workers and each worker pays for the module's fixtures
    (a synthesis, a scenario): a test with no group joins its module's group, and the
    infrastructure tests one group (their syntheses are session fixtures)."""
    for item in items:
        if item.get_closest_marker("xdist_group") or not item.path.is_relative_to(TESTS):
            continue
        module = item.path.relative_to(TESTS).as_posix()
        item.add_marker(pytest.mark.xdist_group("infra" if module.startswith("infra/") else module))


def long_groups_first(items: list[pytest.Item]) -> None:
    """The xdist groups holding a test marked ``long`` first, in a stable order otherwise:
    xdist hands groups out in collection order, and a long test handed out last would run
    alone while the other workers wait (make test-deep: the 8,192-task recovery beside the
    campaigns)."""
    def group(item: pytest.Item) -> str:
        marker = item.get_closest_marker("xdist_group")
        return str(marker.args[0]) if marker and marker.args else item.nodeid

    long = {group(item) for item in items if item.get_closest_marker("long")}
    if long:
        items.sort(key=lambda item: group(item) not in long)


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marker it adds
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    group_by_module(items)
    for item in items:
        if item.path.is_relative_to(TESTS / "crash_consistency"):
            item.add_marker(pytest.mark.campaign)
    long_groups_first(items)
    if not config.getoption("--quick"):
        # the slow modules' tests carry the marker too, so `-m slow` (make test-slow) selects them
        for item in items:
            if in_slow_module(item.path):
                item.add_marker(pytest.mark.slow)
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
