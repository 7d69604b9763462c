"""Runs a documentation block as a reader would, against the playground.

A shell block runs in bash (``set -o pipefail``), one logical line at a time, in a scratch
directory that holds the repository's ``examples/`` and ``.venv`` (so ``examples/job.yaml``
and ``. .venv/bin/activate`` work and a ``| tee watch.log`` writes nothing into the
repository), with the environment a reader has after pasting the playground's ``export``
lines. What a reader would adapt, the runner adapts, and nothing else:

* the playground's endpoints and files: ``127.0.0.1:8080`` / ``:8081`` (the pages show the
  default ports) are the running playground's, and ``export VAR=...`` of a variable the
  playground's banner exports gets the banner's value;
* ``<placeholder>``: the value a line before it printed, the line saying so in its comment
  (``gpujobs submit -f examples/job.yaml   # prints <id>``);
* a job id the page made up (``llama-ft-20261120-143201-7f3a``) stands for a job of the
  reader's that runs now: the runner submits ``examples/job.yaml`` and waits for RUNNING
  before the block;
* ``make`` lines are not run (``make playground`` is the playground already running;
  ``make demo`` / ``make test`` run in their own tests): their targets and arguments are
  checked (``names.py``).

A line fails when it exits otherwise than its comment says (``(exit 1)``; 0 if it says
nothing). After each block every job still live is canceled, so the next block starts on an
idle cluster (as a newcomer's playground would be).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.docs.blocks import REPO, Block
from tests.docs.names import command_problems, logical_lines, simple_commands

JOB_ID = re.compile(r"\b[a-z][a-z0-9-]*-\d{8}-\d{6}-[0-9a-f]{4}\b")
PLACEHOLDER = re.compile(r"<([A-Za-z][\w ]*)>")
EXPECTED_EXIT = re.compile(r"\(exit (\d+)\)")
PRINTS = re.compile(r"prints (<[A-Za-z][\w ]*>)")
DOC_PORTS = {"api": "127.0.0.1:8080", "aws": "127.0.0.1:8081"}
LINE_MARK, FAIL_MARK = "::doc-line", "::doc-fail"


@dataclass
class BlockRun:
    block: Block
    ok: bool
    output: str  # stdout and stderr of every line, as a terminal would show them (markers removed)
    stdout: str
    problem: str = ""
    seconds: float = 0.0
    lines: list[str] = field(default_factory=list)  # the logical lines, as written


def split_comment(line: str) -> tuple[str, str]:
    """(command, comment) of a shell line: a ``#`` after whitespace, outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def variable(placeholder: str) -> str:
    """``<LOW job id>`` -> ``DOC_LOW_JOB_ID``."""
    return "DOC_" + re.sub(r"\W+", "_", placeholder.strip("<>")).upper()


class Adapter:
    """Rewrites a block's lines for this playground (see the module docstring)."""

    def __init__(self, exports: dict[str, str]) -> None:
        self.exports = exports
        api = exports["GPUJOBS_ENDPOINT"].split("//", 1)[-1]
        aws = exports.get("AWS_ENDPOINT_URL", "").split("//", 1)[-1]
        self.hosts = {DOC_PORTS["api"]: api, DOC_PORTS["aws"]: aws}

    def line(self, command: str, known: set[str]) -> str:
        for doc, real in self.hosts.items():
            command = command.replace(doc, real)
        for name, value in self.exports.items():
            command = re.sub(rf"\b{name}=\S+", f"{name}={value}", command)
        command = JOB_ID.sub('"$DOC_JOB"', command)

        def placeholder(match: re.Match[str]) -> str:
            name = variable(match.group(0))
            if name not in known:
                raise ValueError(f"uses {match.group(0)}, which no line before it prints "
                                 "(say so in its comment: '# prints <...>')")
            return f'"${name}"'

        return PLACEHOLDER.sub(placeholder, command)


def shell_script(block: Block, adapter: Adapter) -> tuple[str, list[str], bool]:
    """The bash script that runs ``block`` line by line, the logical lines, and whether it
    needs a running job of the reader's (a made-up job id)."""
    lines = logical_lines(block.text)
    known: set[str] = set()
    needs_job = any(JOB_ID.search(split_comment(line)[0]) for line in lines)
    out = ["set -o pipefail"]
    if needs_job:
        out.append('DOC_JOB=$(gpujobs submit -f examples/job.yaml) && '
                   'gpujobs watch "$DOC_JOB" --until RUNNING >/dev/null '
                   '|| { echo "::doc-fixture a running job could not be made" >&2; exit 96; }')
    for number, line in enumerate(lines, 1):
        command, comment = split_comment(line)
        words = next(simple_commands(command), [])
        if words and words[0] == "make":
            problems = command_problems(words)
            if problems:
                raise ValueError(f"line {number} `{line.strip()}`: {'; '.join(problems)}")
            continue  # checked, not run: see the module docstring
        command = adapter.line(command, known)
        expected = int(m.group(1)) if (m := EXPECTED_EXIT.search(comment)) else 0
        out.append(f'echo "{LINE_MARK} {number}" >&2')
        capture = PRINTS.search(comment)
        if capture:
            name = variable(capture.group(1))
            out.append(f"{name}=$({command})")
            out.append("__st=$?")
            out.append(f'printf "%s\\n" "${name}"')
            known.add(name)
        else:
            out.append(command)
            out.append("__st=$?")
        out.append(f'if [ "$__st" != {expected} ]; then echo "{FAIL_MARK} {number} $__st" >&2; exit 97; fi')
    return "\n".join(out) + "\n", lines, needs_job


class DocShell:
    """Runs blocks against one playground (``exports``: its banner's), as ``user``."""

    def __init__(self, exports: dict[str, str], user: str) -> None:
        self.exports = exports
        self.user = user
        self.adapter = Adapter(exports)
        self.scratch = Path(tempfile.mkdtemp(prefix="doc-blocks-"))
        for name in ("examples", ".venv"):
            (self.scratch / name).symlink_to(REPO / name)

    def environment(self, *, playground: bool = True) -> dict[str, str]:
        """A reader's shell: the repository's .venv first on PATH, and (``playground``) the
        playground's exports; watch and logs --follow poll every 0.2 s instead of 5 and 2
        (``GPUJOBS_POLL_SECONDS``: the pages' commands, sooner done)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        if playground:
            env.update(self.exports)
        env.update(USER=self.user, NO_COLOR="1", PYTHONUNBUFFERED="1", GPUJOBS_POLL_SECONDS="0.2",
                   PATH=f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                   PYTHONPATH=f"{REPO / 'lambdas'}{os.pathsep}{REPO}")
        return env

    def run(self, block: Block, timeout: float = 240.0) -> BlockRun:
        started = time.monotonic()
        try:
            script, lines, _ = shell_script(block, self.adapter)
        except ValueError as error:
            return BlockRun(block, False, "", "", str(error))
        try:
            done = subprocess.run(["bash", "-c", script], cwd=self.scratch, env=self.environment(),
                                  capture_output=True, text=True, timeout=timeout, check=False)
            stdout, stderr, code = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as expired:
            stdout = _text(expired.stdout)
            stderr = _text(expired.stderr)
            code = -1
        seconds = time.monotonic() - started
        output = "\n".join(line for line in (stdout + stderr).splitlines()
                           if not line.startswith(("::doc-", )))
        problem = ""
        if code != 0:
            marks = [line for line in stderr.splitlines() if line.startswith("::doc-")]
            reached = [int(m.split()[1]) for m in marks if m.startswith(LINE_MARK)]
            failed = next((m for m in marks if m.startswith(FAIL_MARK)), "")
            if failed:
                number, status = (int(x) for x in failed.split()[1:3])
                problem = f"line {number} `{lines[number - 1].strip()}` exited {status}"
            elif code == -1:
                where = f"line {reached[-1]} `{lines[reached[-1] - 1].strip()}`" if reached else "its start"
                problem = f"still running after {timeout:g} s, at {where}"
            elif code == 96:
                problem = ("the running job it needs could not be made (gpujobs submit, "
                           "watch --until RUNNING)")
            else:
                problem = f"bash exited {code}"
        return BlockRun(block, not problem, output, stdout, problem, seconds, lines)

    def run_python(self, block: Block, timeout: float = 300.0) -> BlockRun:
        started = time.monotonic()
        path = self.scratch / f"block_{block.line}.py"
        path.write_text(block.text)
        try:
            done = subprocess.run([sys.executable, str(path)], cwd=REPO,
                                  env=self.environment(playground=False), capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return BlockRun(block, False, "", "", f"still running after {timeout:g} s")
        problem = "" if done.returncode == 0 else f"exited {done.returncode}"
        return BlockRun(block, not problem, done.stdout + done.stderr, done.stdout, problem,
                        time.monotonic() - started)


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def settle(exports: dict[str, str], user: str, timeout: float = 60.0) -> list[str]:
    """What a newcomer's fresh playground is, for the next block: every job still live
    canceled (through the jobs API, as an admin) and ended, the breaker reset with an empty
    window (its reset's effect). The ids still live after ``timeout``."""
    from cli.gpujobs import TERMINAL_STATES, ApiClient

    client = ApiClient(exports["GPUJOBS_ENDPOINT"], timeout=30, local_user=user)
    jobs = client.list_jobs(limit=100).get("jobs") or []
    live = [j["job_id"] for j in jobs if j.get("state") not in TERMINAL_STATES]
    for job_id in live:
        client.cancel(job_id)
    deadline = time.monotonic() + timeout
    while live and time.monotonic() < deadline:
        live = [j for j in live if client.get_job(j).get("state") not in TERMINAL_STATES]
        time.sleep(0.2)
    _reset_breaker(exports)
    return live


def _reset_breaker(exports: dict[str, str]) -> None:
    import json

    import boto3

    from gpu_recovery.recovery.breaker.operations import reset_breaker
    from gpu_recovery.repository import Repository

    outputs = json.loads(Path(exports["GPU_RECOVERY_OUTPUTS_FILE"]).read_text())
    tables = next(iter(outputs.values()))
    dynamodb = boto3.resource("dynamodb", endpoint_url=exports["AWS_ENDPOINT_URL"],
                              region_name=exports["AWS_DEFAULT_REGION"], aws_access_key_id="testing",
                              aws_secret_access_key="testing")  # the emulator's
    repo = Repository(dynamodb, tables["JobTableName"], tables["InstanceTableName"])
    stored = repo.breaker.read()
    if stored and (stored.get("window") or stored.get("state") != "closed" or stored.get("backlog")):
        reset_breaker(repo.breaker, now=time.time(), resume_backlog=True, by="doc-tests")
