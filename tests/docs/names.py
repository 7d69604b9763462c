"""Does a documented command name only what exists? The project's commands are parsed as
their programs parse them: ``gpujobs`` and ``gpu-recovery-admin`` by their argparse parsers,
``make`` by the Makefile's targets (and ``PLAYGROUND_ARGS`` / ``DOCTOR_ARGS`` / ``CDK_ARGS``
by the parsers those targets hand them to), ``-c key=value`` by the CDK app's context keys.
Other programs (``aws``, ``jq``, ...) are only named: the AWS CLI is not installed here."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Callable, Iterator
from functools import cache

from tests.docs.blocks import REPO

#: programs a block may use that are not the project's (not checked beyond their name)
EXTERNAL = frozenset({
    "aws", "jq", "echo", "cat", "grep", "tee", "head", "tail", "sort", "xargs", "cd", "ls", "sleep",
    "export", "source", ".", "npx", "pip", "python", "python3", ".venv/bin/python", "curl", "while",
    "do", "done", "read", "for", "if", "then", "fi", "true", "false", "test", "[", "wc", "sed",
    "printf", "env", "set", "unset", "kill", "wait", "timeout", "nvidia-smi", "nvidia-persistenced",
    "systemctl", "dcgmi", "git",
})
CONTROL = {"|", "||", "&&", ";", "&", "(", ")", "|&", ";;"}
REDIRECT = re.compile(r"^\d*[<>]+&?\d*$")
PLACEHOLDER = re.compile(r"<[^<>]+>")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def simple_commands(line: str) -> Iterator[list[str]]:
    """The simple commands of a shell line (words, without assignments in front, redirections
    and control operators); ``$(...)`` substitutions are commands of their own."""
    for inner in re.findall(r"\$\(([^()]*)\)", line):
        yield from simple_commands(inner)
    line = re.sub(r"\$\([^()]*\)", "SUBSTITUTED", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
            continue
        if token in CONTROL:
            if words:
                yield words
            words = []
        elif REDIRECT.match(token):
            skip_next = True  # the file redirected to
        elif not words and ASSIGNMENT.match(token):
            continue  # VAR=value before the command
        else:
            words.append(token)
    if words:
        yield words


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """argparse's complaint about ``argv`` ('' when it parses); never exits."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as exit_:
            if exit_.code:
                return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "refused"
    return ""


@cache
def parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    from cli import admin, gpujobs
    from local_mode.playground.command_line import build_parser as playground_parser

    return {"gpujobs": gpujobs.build_parser, "gpu-recovery-admin": admin.build_parser,
            "playground": playground_parser}


@cache
def make_targets() -> frozenset[str]:
    targets = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z][\w -]*?)\s*:(?!=)", line)
        if match and not line.startswith((".", "\t")):
            targets.update(match.group(1).split())
    return frozenset(targets)


@cache
def context_keys() -> frozenset[str]:
    from infra.config import KNOWN_KEYS

    return frozenset(KNOWN_KEYS)


def _concrete(words: list[str]) -> list[str]:
    """A documented command as a program would get it: placeholders filled, optional
    ``[--flag value]`` notation opened."""
    out = []
    for word in words:
        word = PLACEHOLDER.sub("x", word)
        if word in ("[", "]") or word == "...":
            continue
        out.append(word.strip("[]") if word.startswith("[") or word.endswith("]") else word)
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def name_problems(parser: argparse.ArgumentParser, argv: list[str], program: str) -> list[str]:
    """Prose quotes a command in part (`gpujobs show`, `quota set|list|remove`): its
    subcommands and options must exist; what it leaves out is not checked."""
    problems: list[str] = []
    parsers = [parser]
    for word in argv:
        if word.startswith("-"):
            option = word.partition("=")[0]
            if not any(option in _options(p) for p in parsers):
                problems.append(f"`{program}`: no option {option}")
            continue
        choices = _subparsers(parsers[-1])
        if not choices:
            continue  # an argument's value
        alternatives = word.split("|")
        missing = [w for w in alternatives if w not in choices]
        if missing:
            problems.append(f"`{program}`: no subcommand {', '.join(missing)} (has: {', '.join(choices)})")
            return problems
        parsers.append(choices[alternatives[0]])
    return problems


def _context_problems(argv: list[str]) -> list[str]:
    problems = []
    for i, word in enumerate(argv):
        if word in ("-c", "--context") and i + 1 < len(argv):
            key = argv[i + 1].partition("=")[0]
            if key not in context_keys():
                problems.append(f"context key {key!r} does not exist (infra/config)")
    return problems


def command_problems(words: list[str], *, partial: bool = False) -> list[str]:
    """What is wrong with one simple command (empty: it names only what exists).
    ``partial``: quoted in prose, perhaps without its required arguments."""
    words = _concrete(words)
    if not words:
        return []
    program, argv = words[0], words[1:]
    name = program.rsplit("/", 1)[-1]
    if program in (".venv/bin/gpu-recovery-admin", ".venv/bin/gpujobs"):
        program = name
    if program in ("python", "python3", ".venv/bin/python") and argv[:2] in (["-m", "cli.gpujobs"],
                                                                            ["-m", "local_mode.playground"]):
        program, argv = ("gpujobs" if argv[1] == "cli.gpujobs" else "playground"), argv[2:]
    if program in ("gpujobs", "gpu-recovery-admin", "playground"):
        if partial:
            return name_problems(parsers()[program](), argv, program)
        complaint = _parse(parsers()[program](), argv)
        return [f"`{program} {' '.join(argv)}`: {complaint}"] if complaint else []
    if program == "make":
        return _make_problems(argv)
    if program in ("cdk", "npx"):
        return _context_problems(argv)
    if program in EXTERNAL or name in EXTERNAL:
        return []
    return [f"`{program}` is not a command of this project nor a known program"]


def _make_problems(argv: list[str]) -> list[str]:
    problems = []
    for word in argv:
        name, assigned, value = word.partition("=")
        if not assigned:
            if word.startswith("-"):
                continue
            if word not in make_targets():
                problems.append(f"`make {word}`: no such target in the Makefile")
            continue
        args = shlex.split(value)
        if name == "PLAYGROUND_ARGS":
            complaint = _parse(parsers()["playground"](), args)
        elif name == "DOCTOR_ARGS":
            complaint = _parse(parsers()["gpu-recovery-admin"](), ["doctor", *args])
        elif name == "CDK_ARGS":
            complaint = "; ".join(_context_problems(args))
        else:
            complaint = ""
        if complaint:
            problems.append(f"`make {word}`: {complaint}")
    return problems


def shell_problems(script: str) -> list[str]:
    """Every command of a shell block that names what does not exist (line by line, with
    continuation lines joined)."""
    problems = []
    for line in logical_lines(script):
        for words in simple_commands(line):
            problems += command_problems(words)
    return problems


def logical_lines(script: str) -> list[str]:
    """The block's commands, one per line: ``\\`` continuations joined, and a quoted string
    that goes on over lines kept whole; comments and blank lines left out."""
    lines, pending = [], ""
    for raw in script.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = pending + raw
        if _open_quote(line):
            pending = line + "\n"
            continue
        pending = ""
        if line.strip() and not line.strip().startswith("#"):
            lines.append(line)
    if pending.strip():
        lines.append(pending)
    return lines


def _open_quote(line: str) -> bool:
    try:
        shlex.split(line, comments=True)
    except ValueError:
        return True
    return False
