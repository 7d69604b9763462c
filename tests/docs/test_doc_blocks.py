"""The documentation is executed: every shell and Python block of README.md, cli/README.md
and docs/ that is meant to run without an AWS account runs here, in the order a reader
follows it, against one playground (``python -m local_mode.playground`` at 40x, as ``make
playground`` starts it); the blocks that need an account (and those that run elsewhere) are
checked for syntax and for naming only commands, options and context keys that exist; what
the pages show a command print is compared with what it printed where that is stable. A
failure names the page, the block's line and what went wrong (tests/docs/blocks.py says how
a block is marked, tests/docs/runner.py how it is run).
"""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import SLOW_DOC_PAGES
from tests.docs.blocks import PAGES, REPO, Block, all_blocks, inline_commands, page_blocks
from tests.docs.names import command_problems, logical_lines, shell_problems
from tests.docs.runner import DocShell, settle
from tests.fixtures.playground import PlaygroundProcess

# One playground for every block: they run in order on one worker (with the other playground
# tests: one at a time on the machine).
pytestmark = pytest.mark.xdist_group("playground")

BLOCKS = all_blocks()
# The slow tier's pages (tests/conftest.py says why) run their blocks in make test-slow only.
RUN = [pytest.param(b, id=b.name, marks=[pytest.mark.slow] if b.page in SLOW_DOC_PAGES else [])
       for b in BLOCKS if b.mode == "run"]
CHECKED = [b for b in BLOCKS if b.mode in ("needs-aws", "checked")]
FRAGMENTS = [b for b in BLOCKS if b.mode == "fragment"]
# The playground the blocks run against: 80 simulated seconds a second (the blocks mostly wait
# on simulated time; a playground that cannot keep up slows its clock, it never skips an event),
# jobs of 6 simulated minutes (4.5 s; a checkpoint every 2), reboots of 60 s. Each block finds
# the cluster as a newcomer's fresh playground is: the runner cancels what a block leaves
# running and resets the breaker (its window empty); a node faulted by an earlier block is not
# escalated to replacement by a later block's fault (the settings below), as it would not be on
# a fresh playground. The breaker's window is an hour: 10 minutes would be 7.5 s of wall time,
# and on a loaded machine the breaker could close by itself (a window after its trip) before
# the commands that read it tripped had run.
PLAYGROUND_ARGS = ("--speed", "80", "--run-minutes", "6", "--reboot-seconds", "60",
                   "--setting", "reboots_before_replace=100", "--setting", "max_remediations=1000",
                   "--setting", "breaker_window_minutes=60")


def ids(blocks: list[Block]) -> list[str]:
    return [b.name for b in blocks]


@pytest.fixture(scope="module")
def shell() -> Iterator[DocShell]:
    process = PlaygroundProcess(*PLAYGROUND_ARGS)
    try:
        exports = process.exports()
        yield DocShell(exports, user=_admin_user())
    finally:
        assert process.stop() == 0, process.console[-3000:]


def _admin_user() -> str:
    """The user the playground makes an admin: whoever started it (its $USER)."""
    import getpass
    import os

    return os.environ.get("USER") or getpass.getuser()


def test_every_page_has_its_blocks_classified() -> None:
    """Every shell and Python block runs, or says why not (needs-aws / checked / fragment,
    with a reason); the README and cli/README's walks run."""
    unexplained = [b.name for b in BLOCKS if b.mode in ("needs-aws", "checked", "fragment") and not b.reason]
    assert not unexplained, f"blocks marked without a reason: {unexplained}"
    kinds = {b.mode for b in BLOCKS if b.page == "README.md" and b.shell}
    assert kinds == {"run"}, "the README's quick start must run"
    assert sum(1 for b in BLOCKS if b.mode == "run" and b.page == "cli/README.md") >= 8
    assert not {"README.md", "cli/README.md"} & set(SLOW_DOC_PAGES)


@pytest.mark.parametrize("block", CHECKED, ids=ids(CHECKED))
def test_blocks_that_need_an_account_name_only_what_exists(block: Block) -> None:
    """Not run (an AWS account, or run elsewhere): valid bash, and every gpujobs /
    gpu-recovery-admin / make / cdk command in it parses as its program parses it."""
    # `<handle>` is the page's placeholder, which a reader fills in: a word for bash -n
    filled = re.sub(r"<[A-Za-z][^<>\n]*>", "PLACEHOLDER", block.text)
    syntax = subprocess.run(["bash", "-n"], input=filled, capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, f"{block.name}: not valid bash: {syntax.stderr.strip()}"
    problems = shell_problems(block.text)
    assert not problems, f"{block.name}: " + "; ".join(problems)


@pytest.mark.parametrize("block", FRAGMENTS, ids=ids(FRAGMENTS))
def test_python_fragments_compile_and_use_what_their_modules_have(block: Block,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tree = ast.parse(block.text, filename=block.name)
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
    for name in re.findall(r"\b(gpu_recovery_client)\.\w+", block.text):
        aliases.setdefault(name, name)
    monkeypatch.syspath_prepend(str(REPO / "training_client"))  # where gpu_recovery_client lives
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            module = importlib.import_module(aliases[node.value.id])
            if not hasattr(module, node.attr):
                missing.append(f"{aliases[node.value.id]}.{node.attr}")
    assert not missing, f"{block.name}: uses what does not exist: {missing}"


@pytest.mark.parametrize("page", PAGES)
def test_commands_quoted_in_the_text_exist(page: str) -> None:
    """Inline `gpujobs ...`, `gpu-recovery-admin ...` and `make ...` in the prose parse too."""
    problems = []
    for line, span in inline_commands(page):
        for piece in re.split(r"\s\|\s|;|&&", span):  # `a|b` inside a word: alternatives
            try:
                words = shlex.split(piece)
            except ValueError as error:
                problems.append(f"{page}:{line} `{span}`: {error}")
                continue
            problems += [f"{page}:{line} `{span}`: {p}" for p in command_problems(words, partial=True)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("block", RUN)
def test_the_block_runs_as_written(block: Block, shell: DocShell) -> None:
    """The block runs against the playground, every line exiting as its comment says, and
    the output the page shows after it (a ``doc-test: output`` block) has the same shape."""
    run = shell.run_python(block) if block.python else shell.run(block)
    try:
        assert run.ok, f"{block.name}: {run.problem}\n--- output (last 60 lines) ---\n" + \
            "\n".join(run.output.splitlines()[-60:])
        shown = _output_after(block)
        if shown is not None:
            problems = output_problems(shown, run.stdout)
            assert not problems, (f"{shown.name} (what {block.name} prints): " + "; ".join(problems)
                                  + "\n--- it printed ---\n" + "\n".join(run.stdout.splitlines()[:40]))
    finally:
        if block.shell:
            left = settle(shell.exports, shell.user)
            assert not left, f"after {block.name}: jobs still live after cancel: {left}"


def _output_after(block: Block) -> Block | None:
    blocks = page_blocks(block.page)
    following = next((b for b in blocks if b.line > block.line), None)
    return following if following is not None and following.mode == "output" else None


def _columns(line: str) -> list[str]:
    return [c for c in re.split(r"\s{2,}", line.strip()) if c]


def output_problems(shown: Block, printed: str) -> list[str]:
    """The shown output's stable lines missing from what was printed: each table header
    (an all-capitals line: its columns, in order, among the printed header's) and each
    ``Label:`` (unless the marker's reason names it, e.g. a line shown only once a job
    had an error)."""
    problems = []
    printed_lines = printed.splitlines()
    headers = [_columns(line) for line in printed_lines if _is_header(line)]
    labels = {m.group(1) for line in printed_lines if (m := re.match(r"^\s*([A-Z][\w ]*?):", line))}
    for line in shown.text.splitlines():
        stripped = line.strip()
        if not stripped or stripped == "...":
            continue
        if _is_header(line):
            want = _columns(stripped)
            if not any(_subsequence(want, have) for have in headers):
                problems.append(f"no header with the columns {want}")
            continue
        label = re.match(r"^\s*([A-Z][\w ]*?):\s", line)
        if label and label.group(1) not in labels and label.group(1) not in shown.reason:
            problems.append(f"no line '{label.group(1)}: ...'")
    return problems


def _is_header(line: str) -> bool:
    """A table's header: two columns or more, each of capitals words (``CONTAINER INSTANCE``)."""
    columns = _columns(line)
    return len(columns) >= 2 and all(re.fullmatch(r"[A-Z][A-Z0-9]+( [A-Z0-9]+)*", c) for c in columns)


def _subsequence(want: list[str], have: list[str]) -> bool:
    remaining = iter(have)
    return all(column in remaining for column in want)


def test_the_output_check_finds_a_renamed_column_and_a_missing_label() -> None:
    shown = Block("x.md", 1, "", "output", "Last error shows once there is one", "\n".join([
        "Job:        j-1", "State:      RUNNING", "Last error: rank 1", "",
        "  RANK  STATE    TASK      LAST HEARTBEAT", "  0     RUNNING  9f2c41d0  -"]))
    printed = "Job:        j-2\nState:      QUEUED\n\n  RANK  STATE  TASK  EC2 INSTANCE  LAST HEARTBEAT\n"
    assert output_problems(shown, printed) == []
    assert output_problems(shown, printed.replace("State:", "Status:")) == ["no line 'State: ...'"]
    assert output_problems(shown, printed.replace("TASK", "TASK ARN")) == [
        "no header with the columns ['RANK', 'STATE', 'TASK', 'LAST HEARTBEAT']"]


def test_the_playground_page_exports_what_the_playground_prints(shell: DocShell) -> None:
    """docs/playground.md's environment block exports every variable the playground's banner
    does (without AWS_DEFAULT_REGION, boto3 has no region: breaker show and quota failed with
    NoRegionError)."""
    [block] = [b for b in page_blocks("docs/playground.md") if "export GPUJOBS_ENDPOINT" in b.text]
    exported = set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", " ".join(
        line for line in logical_lines(block.text) if line.lstrip().startswith("export "))))
    assert exported == set(shell.exports), set(shell.exports) ^ exported


def test_the_runner_names_the_line_that_failed(shell: DocShell) -> None:
    """A block whose second line fails is reported at that line, with its exit status; a
    placeholder nothing printed is refused before anything runs."""
    block = Block("x.md", 7, "bash", "run", "",
                  "gpujobs list   # all jobs\ngpujobs show nope-20261120-000000-0000x\n")
    run = shell.run(block)
    assert not run.ok and run.problem == "line 2 `gpujobs show nope-20261120-000000-0000x` exited 2"
    run = shell.run(Block("x.md", 9, "bash", "run", "", "gpujobs watch <id>\n"))
    assert not run.ok and "uses <id>, which no line before it prints" in run.problem
    assert (REPO / "README.md").exists()
