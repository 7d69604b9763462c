"""Architecture rules, checked statically (AST) so a violation fails ``make test``:

* **Adapters are the only boto3 users.** No module of ``lambdas/`` outside
  ``gpu_recovery/adapters/`` calls an AWS API: services receive adapter objects that
  ``gpu_recovery/runtime.py`` builds (runtime builds clients but calls no operation).
* **The repository is the only DynamoDB user.** Nothing outside ``gpu_recovery/repository/``
  calls a DynamoDB operation or builds a ``Table``, with two documented exceptions:
  ``runtime.py`` builds the DynamoDB resource (and the node-token ``Table``) it hands to
  the repositories, and ``handlers/jobs_api.py`` gives the DynamoDB client to the
  Powertools idempotency layer (``DynamoDBPersistenceLayer``), a library that owns its
  own table and item format: wrapping it in a repository would only re-export it.

How an AWS call is recognised (no false positive on the adapters' own methods, several of
which mirror the API's names, e.g. ``EcsAdapter.stop_task(task_arn, reason)``):

* a boto3 client method accepts **keyword arguments only**, named after the operation's
  input shape (``cluster=``, ``taskDefinition=``, ``InstanceIds=``). A call ``x.<op>(...)``
  where ``<op>`` is an operation of a service the project uses, with no positional
  argument and every keyword a member of that operation's input shape, is a raw API
  call. With ``**params`` or no argument at all it is one too, unless the project itself
  defines a method of that name (then it is taken for the project's method);
* ``get_paginator``, ``<client>.exceptions``, ``.meta.client``, ``boto3.client/resource``
  and ``aws.client/resource`` only make sense on (or to get) raw clients.

The operation names and input members come from botocore's bundled service models.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import botocore.session
import pytest
from botocore import xform_name

ROOT = Path(__file__).resolve().parent.parent
LAMBDAS = ROOT / "lambdas"
PACKAGE = LAMBDAS / "gpu_recovery"
ADAPTERS = PACKAGE / "adapters"
REPOSITORY = PACKAGE / "repository"
RUNTIME = PACKAGE / "runtime.py"
JOBS_API = LAMBDAS / "handlers" / "jobs_api.py"
# Every service a Lambda of this project talks to (runtime.py must name no other one:
# see test_the_checked_services_cover_every_client_runtime_builds).
SERVICES = ("autoscaling", "cloudwatch", "dynamodb", "ec2", "ecs", "lambda", "logs", "sns", "sqs", "ssm",
            "sts")
RAW_CLIENT_ATTRIBUTES = ("get_paginator", "can_paginate", "generate_presigned_url")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


@cache
def operations() -> dict[str, dict[str, list[frozenset[str]]]]:
    """service -> snake_case operation -> input members (one set per service defining it)."""
    session = botocore.session.get_session()
    found: dict[str, dict[str, list[frozenset[str]]]] = {}
    for service in SERVICES:
        model = session.get_service_model(service)
        ops: dict[str, list[frozenset[str]]] = {}
        for name in model.operation_names:
            shape = model.operation_model(name).input_shape
            ops.setdefault(xform_name(name), []).append(frozenset(shape.members) if shape else frozenset())
        found[service] = ops
    return found


def _sources(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


@cache
def project_methods() -> frozenset[str]:
    """Names of every function the project defines (a call by one of these names with no
    keyword arguments is taken for the project's own method)."""
    names: set[str] = set()
    for path in _sources(LAMBDAS):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
    return frozenset(names)


def aws_call(call: ast.Call, services: Iterable[str]) -> str | None:
    """``service:operation`` when ``call`` looks like a boto3 client (or resource) call."""
    if not isinstance(call.func, ast.Attribute) or call.args:
        return None
    name = call.func.attr
    named = {k.arg for k in call.keywords if k.arg is not None}
    splat = any(k.arg is None for k in call.keywords)
    for service in services:
        shapes = operations()[service].get(name)
        if not shapes:
            continue
        if named and any(named <= members for members in shapes):
            return f"{service}:{name}"
        if not named and name not in project_methods():
            return f"{service}:{name}" + (" (**params)" if splat else "")
    return None


def _dotted(node: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _first_string(call: ast.Call) -> str:
    arg = call.args[0] if call.args else None
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""


def scan(source: str, path: str, *, aws_services: Iterable[str] = (), raw_clients: bool = False,
         dynamodb: bool = False, clients_allowed: bool = False,
         dynamodb_wiring_allowed: bool = False) -> list[Finding]:
    """Findings of one module.

    * ``aws_services``: calls of these services' operations;
    * ``raw_clients``: raw-client markers, ``import boto3``, clients built (unless
      ``clients_allowed``: runtime.py builds them; a DynamoDB client or resource is also
      allowed with ``dynamodb_wiring_allowed``);
    * ``dynamodb``: any use of DynamoDB: its operations, ``Table``, ``.meta.client``,
      ``boto3.dynamodb``, its client or resource built (unless ``dynamodb_wiring_allowed``).
    """
    tree = ast.parse(source, path)
    findings: list[Finding] = []
    services = tuple(aws_services) + (("dynamodb",) if dynamodb else ())

    def add(node: ast.AST, what: str) -> None:
        findings.append(Finding(path, getattr(node, "lineno", 0), what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module.startswith("boto3.dynamodb"):
                    if dynamodb:
                        add(node, f"imports {module}")
                elif (module == "boto3" or module.startswith("boto3.")) and raw_clients:
                    add(node, f"imports {module}")
        elif isinstance(node, ast.Call):
            hit = aws_call(node, services)
            if hit:
                add(node, f"calls the AWS API {hit} on a raw client")
            dotted = _dotted(node.func)
            if dotted in ("boto3.client", "boto3.resource", "aws.client", "aws.resource",
                          "boto3.session.Session", "boto3.Session"):
                is_dynamodb = _first_string(node) == "dynamodb"
                wired = is_dynamodb and dynamodb_wiring_allowed
                if (raw_clients and not clients_allowed and not wired) or (dynamodb and is_dynamodb
                                                                            and not wired):
                    add(node, f"builds a client: {dotted}({_first_string(node)!r})")
            if dynamodb and dotted.rsplit(".", 1)[-1] == "Table" and not dynamodb_wiring_allowed:
                add(node, f"builds a DynamoDB Table: {dotted}(...)")
        elif isinstance(node, ast.Attribute):
            if raw_clients and node.attr in RAW_CLIENT_ATTRIBUTES:
                add(node, f"uses {node.attr} (raw boto3 clients only)")
            elif raw_clients and node.attr == "exceptions" and _dotted(node.value) not in ("botocore", ""):
                add(node, f"uses {_dotted(node)} (a raw client's modeled exceptions)")
            elif (dynamodb and node.attr == "client" and isinstance(node.value, ast.Attribute)
                  and node.value.attr == "meta"):
                add(node, "uses .meta.client (the raw client under a boto3 resource)")
    return findings


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _inside(path: Path, folder: Path) -> bool:
    return folder in path.parents


def _modules() -> Iterator[Path]:
    yield from _sources(PACKAGE)
    yield from _sources(LAMBDAS / "handlers")


OTHER_SERVICES = tuple(s for s in SERVICES if s != "dynamodb")


def test_only_adapters_call_aws_apis() -> None:
    """Given every module of lambdas/ outside gpu_recovery/adapters/
    When its calls are scanned
    Then none calls an AWS API other than DynamoDB (the repository's, checked below) nor
    touches a raw client; only runtime.py (and the idempotency layer's wiring) builds clients."""
    findings: list[Finding] = []
    for path in _modules():
        if _inside(path, ADAPTERS):
            continue
        findings += scan(path.read_text(), _relative(path), aws_services=OTHER_SERVICES, raw_clients=True,
                         clients_allowed=path == RUNTIME,
                         dynamodb_wiring_allowed=path in (RUNTIME, JOBS_API) or _inside(path, REPOSITORY))
    assert not findings, "AWS calls outside gpu_recovery/adapters/:\n" + "\n".join(sorted(map(str, findings)))


def test_only_the_repository_uses_dynamodb() -> None:
    """Given every module of lambdas/ outside gpu_recovery/repository/ (and the adapters,
    which use no DynamoDB either)
    When its calls are scanned
    Then none calls a DynamoDB operation, builds a Table or uses boto3.dynamodb; runtime.py
    only builds the resource the repositories receive, and handlers/jobs_api.py only hands
    the DynamoDB client to the Powertools idempotency layer (see the module docstring)."""
    findings: list[Finding] = []
    for path in _modules():
        if _inside(path, REPOSITORY):
            continue
        findings += scan(path.read_text(), _relative(path), dynamodb=True,
                         dynamodb_wiring_allowed=path in (RUNTIME, JOBS_API))
    assert not findings, ("DynamoDB used outside gpu_recovery/repository/:\n"
                          + "\n".join(sorted(map(str, findings))))


def test_the_checked_services_cover_every_client_runtime_builds() -> None:
    """Given the services runtime.py (and the adapters) build clients for
    When compared with the services whose operations are checked
    Then none is missing (a new service would otherwise escape the check)."""
    named: set[str] = set()
    for path in [RUNTIME, JOBS_API, *_sources(ADAPTERS)]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and _first_string(node)
                    and _dotted(node.func) in ("aws.client", "aws.resource", "sess.client", "sess.resource")):
                named.add(_first_string(node))
    assert named and named <= set(SERVICES), sorted(named - set(SERVICES))


# ----------------------------------------------------------------- the checker itself
# What the queue did before the adapters took these calls over (issue 7's audit): each
# must be found. And what services do with adapters (same names, positional or
# snake_case arguments): none may be.
VIOLATIONS = {
    "describe_task_definition": "self._ecs.describe_task_definition(taskDefinition=ref)['taskDefinition']",
    "stop_task": "self._ecs.stop_task(cluster=self.cluster, task=task_arn, reason=reason[:255])",
    "get_log_events": "self._logs.get_log_events(**params)",
    "get_log_events kw": "self._logs.get_log_events(logGroupName=g, logStreamName=s, startFromHead=True)",
    "paginator": "self._ecs.get_paginator('list_container_instances').paginate(cluster=self.cluster)",
    "describe_container_instances":
        "self._ecs.describe_container_instances(cluster=self.cluster, containerInstances=arns[0:100])",
    "invoke": "self._lambda.invoke(FunctionName=f, InvocationType='Event', Payload=b'{}')",
    "describe_instances": "self._ec2.describe_instances(InstanceIds=[instance_id])",
    "describe_instance_information":
        "self._ssm.describe_instance_information(Filters=[{'Key': 'InstanceIds', 'Values': [i]}])",
    "modeled exception": "try:\n    pass\nexcept self._logs.exceptions.ResourceNotFoundException:\n    pass",
    "client": "ecs = aws.client('ecs')",
}
ADAPTER_STYLE = [
    "self.ecs.stop_task(rank.task_arn, 'why')",
    "self.ecs.start_task(task_definition=td, container_instance_arn=ci, overrides=o, tags=t, started_by=sb)",
    "self.ecs.describe_task(task_arn)",
    "self.ecs.container_instances(('ACTIVE',))",
    "self.task_definitions.describe(ref)",
    "self.hosts.address(instance_id)",
    "self.logs.read_stream(group, stream, limit=10, next_token=None)",
    "self.repo.get_ranks(job)",
    "self.notifier.publish(notification)",
    "self.rebooter.reboot(instance_id, reason)",
    "items.update(other)",
    "d.get('key')",
]


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_the_checker_finds_raw_client_calls(name: str) -> None:
    """Given a snippet of the raw-client calls the queue made before the adapters existed
    When it is scanned as a service module
    Then it is reported."""
    assert scan(VIOLATIONS[name], "snippet.py", aws_services=OTHER_SERVICES, raw_clients=True), name


DYNAMODB_VIOLATIONS = [
    "table.query(IndexName=i, KeyConditionExpression=k)",
    "self._table.get_item(Key={'job_id_rank': key}, ConsistentRead=True)",
    "aws.resource('dynamodb').Table(name)",
    "self._client.transact_write_items(TransactItems=items)",
    "from boto3.dynamodb.conditions import Key",
]


@pytest.mark.parametrize("snippet", DYNAMODB_VIOLATIONS)
def test_the_checker_finds_dynamodb_use(snippet: str) -> None:
    """Given a DynamoDB call of the kind the heartbeat service and the queue once made directly
    When it is scanned as a module outside the repository
    Then it is reported."""
    assert scan(snippet, "snippet.py", dynamodb=True)


@pytest.mark.parametrize("snippet", ADAPTER_STYLE)
def test_the_checker_leaves_adapter_and_repository_calls_alone(snippet: str) -> None:
    """Given calls on adapters, ports and plain objects (some named like AWS operations)
    When scanned
    Then nothing is reported."""
    assert scan(snippet, "snippet.py", aws_services=OTHER_SERVICES, raw_clients=True, dynamodb=True) == []
