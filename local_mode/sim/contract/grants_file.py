"""The deployed functions' grants as data: what each function's role allows, taken from the
synthesized template into ``grants.json`` (committed; ``make contract-grants`` writes it,
tests/infra/test_infra_grants.py fails when it differs from the template).

Synthesis takes ~20 s (jsii), so the runs read this file instead. It holds, per function
(keyed by its handler module, ``handlers.<module>.lambda_handler``), the function's and its
role's logical ids, its Powertools service name, every statement of the role's policies
(``AWS::IAM::Policy`` attached to the role and the role's inline ``Policies``; CDK's grant
helpers, ``grant_read_write_data``, ``grant_publish``, a log group's ``grant``, already
expanded to their statements in the template) and the *platform* needs of the function: what
Lambda itself does with the role (the function's own log group, X-Ray with active tracing,
an SQS event source's polling, an on-failure destination).

References in the template are written as placeholders the guard resolves for the world it
runs in: ``${account}``, ``${region}`` and ``${cluster}`` for the synthesis's account, region
and cluster name (the instance tag's default value, the cluster name, too), and
``${<symbol>.Arn}`` / ``${<symbol>.Ref}`` for ``Fn::GetAtt [X, Arn]`` / ``Ref X`` of the
stack's resources, each named by its role in the stack (:func:`stack_symbols`:
``table:job``, ``topic:alerts``, ``queue:gang``, ``log-group:function:TaskHandler``...).
A reference to a resource with no symbol stops the extraction (name it there).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

GRANTS_FILE = Path(__file__).resolve().parent / "grants.json"
#: what the file is synthesized with (tests/infra's default synthesis: the same context)
SYNTH_ACCOUNT = "111122223333"
SYNTH_REGION = "us-east-1"
SYNTH_CONTEXT = {"cluster_name": "gpu-cluster"}
REGENERATE = "make contract-grants"
#: configuration options whose grants runs need beside the default's: the context that turns
#: one on and the actions it adds (the guard adds them when the run's settings choose it)
VARIANTS: dict[str, dict[str, Any]] = {
    "replace_action=terminate_in_asg": {"context": {"replace_action": "terminate_in_asg"},
                                        "actions": ("autoscaling:",)},
}

_HANDLER = re.compile(r"^handlers\.([a-z_]+)\.lambda_handler$")


class ExtractionError(ValueError):
    """The template holds something the extraction cannot express (say what to add)."""


def stack_symbols(stack: Any) -> dict[str, str]:
    """Logical id -> symbol, for every resource of ``stack`` (a ``GpuRecoveryStack``) a role's
    policy may name."""
    pairs: list[tuple[Any, str]] = []
    pairs += [(table, f"table:{kind}") for kind, table in stack.tables.tables.items()]
    pairs += [(stack.node_api.token_table, "table:node_token"),
              (stack.jobs_api.idempotency_table, "table:idempotency"),
              (stack.notifications.topic, "topic:alerts"), (stack.notifications.key, "key:alerts"),
              (stack.gang.queue, "queue:gang"), (stack.tag_lookups.queue, "queue:tag-lookups"),
              (stack.reboot_document.document, "document:reboot")]
    pairs += [(queue, f"queue:dlq:{name}") for name, queue in stack.dead_letter_queues.items()]
    for name, fn in stack.functions.items():
        pairs += [(fn.function, f"function:{name}"), (fn.log_group, f"log-group:function:{name}"),
                  (fn.role, f"role:function:{name}")]
    for prefix, part in (("health-check", stack.health_check), ("gpu-reset", stack.gpu_reset)):
        if getattr(part, "log_group", None) is not None:
            pairs.append((part.log_group, f"log-group:{prefix}"))
        definition = getattr(part, "task_definition", None)
        if definition is not None:
            pairs.append((definition.task_role, f"role:{prefix}-task"))
            if definition.execution_role is not None:
                pairs.append((definition.execution_role, f"role:{prefix}-execution"))
    symbols: dict[str, str] = {}
    for construct, symbol in pairs:
        element = construct if hasattr(construct, "logical_id") else construct.node.default_child
        logical_id = stack.resolve(element.logical_id)
        symbols.setdefault(str(logical_id), symbol)
    return symbols


class _Renderer:
    def __init__(self, symbols: Mapping[str, str], *, account: str, region: str, cluster: str,
                 tag: tuple[str, str] | None = None) -> None:
        self.symbols = symbols
        self.literals = ((account, "${account}"), (region, "${region}"), (cluster, "${cluster}"))
        self.tag = tag

    def conditions(self, block: Mapping[str, Any]) -> dict[str, Any]:
        """A Condition element; the instance tag (``instance_tag_key`` / ``_value``) as
        ``${instance_tag_key}`` / ``${instance_tag_value}``."""
        out: dict[str, Any] = {}
        for operator, keys in block.items():
            rendered: dict[str, Any] = {}
            for key, values in keys.items():
                if self.tag is not None and key.lower() == f"aws:resourcetag/{self.tag[0]}".lower():
                    key = "aws:ResourceTag/${instance_tag_key}"
                    values = ["${instance_tag_value}" if v == self.tag[1] else v for v in _listed(values)]
                    values = values[0] if len(values) == 1 else values
                rendered[self.text(key) if "${" not in key else key] = self.value(values)
            out[operator] = rendered
        return out

    def text(self, value: str) -> str:
        for literal, placeholder in self.literals:
            value = value.replace(literal, placeholder)
        return value

    def value(self, node: Any) -> Any:
        """A policy value (string, list, or CloudFormation intrinsic) with placeholders."""
        if isinstance(node, str):
            return self.text(node)
        if isinstance(node, bool | int | float):
            return node
        if isinstance(node, list):
            return [self.value(n) for n in node]
        if isinstance(node, dict) and len(node) == 1:
            (fn, arg), = node.items()
            if fn == "Ref":
                pseudo = {"AWS::Partition": "aws", "AWS::Region": "${region}", "AWS::AccountId": "${account}",
                          "AWS::URLSuffix": "amazonaws.com"}
                if arg in pseudo:
                    return pseudo[arg]
                return f"${{{self._symbol(arg)}.Ref}}"
            if fn == "Fn::GetAtt" and isinstance(arg, list) and arg[1:] == ["Arn"]:
                return f"${{{self._symbol(arg[0])}.Arn}}"
            if fn == "Fn::Join":
                separator, parts = arg
                return str(separator).join(str(self.value(p)) for p in parts)
        if isinstance(node, dict) and all(isinstance(k, str) and not k.startswith("Fn::") for k in node):
            return {self.text(k): self.value(v) for k, v in node.items()}
        raise ExtractionError(f"cannot express {json.dumps(node)[:200]} in the grants file")

    def _symbol(self, logical_id: str) -> str:
        symbol = self.symbols.get(logical_id)
        if symbol is None:
            raise ExtractionError(f"a role's policy names {logical_id}, which has no symbol: name it in "
                                  "local_mode/sim/contract/grants_file.py stack_symbols (and resolve it in "
                                  "grants.py)")
        return symbol


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _statement(raw: Mapping[str, Any], render: _Renderer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "Sid" in raw:
        out["Sid"] = raw["Sid"]
    out["Effect"] = raw["Effect"]
    for element in ("Action", "NotAction", "Resource", "NotResource"):
        if element in raw:
            out[element] = [render.value(v) for v in _listed(raw[element])]
    if raw.get("Condition"):
        out["Condition"] = render.conditions(raw["Condition"])
    unknown = set(raw) - {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition"}
    if unknown:
        raise ExtractionError(f"statement elements {sorted(unknown)} are not supported")
    return out


def _ref_of(node: Any) -> str | None:
    if isinstance(node, dict):
        if "Ref" in node:
            return str(node["Ref"])
        if "Fn::GetAtt" in node:
            return str(node["Fn::GetAtt"][0])
    return None


def extract(template: Mapping[str, Any], symbols: Mapping[str, str], *, functions: Mapping[str, str],
            account: str = SYNTH_ACCOUNT, region: str = SYNTH_REGION,
            cluster: str = SYNTH_CONTEXT["cluster_name"],
            tag: tuple[str, str] | None = None) -> dict[str, Any]:
    """The grants file's content for ``template``. ``symbols``: :func:`stack_symbols`;
    ``functions``: function logical id -> the stack's name for it (``stack.functions``);
    ``tag``: the instance tag's key and value."""
    render = _Renderer(symbols, account=account, region=region, cluster=cluster, tag=tag)
    resources: Mapping[str, Any] = template["Resources"]
    by_role: dict[str, list[dict[str, Any]]] = {}
    for logical_id, resource in resources.items():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::IAM::Policy":
            for role in props.get("Roles", []):
                by_role.setdefault(str(_ref_of(role)), []).extend(props["PolicyDocument"]["Statement"])
        elif resource["Type"] == "AWS::IAM::Role":
            for policy in props.get("Policies", []):
                by_role.setdefault(logical_id, []).extend(policy["PolicyDocument"]["Statement"])
    platform = _platform_needs(resources, render)
    out: dict[str, Any] = {}
    for logical_id, resource in sorted(resources.items()):
        if resource["Type"] != "AWS::Lambda::Function":
            continue
        props = resource["Properties"]
        match = _HANDLER.match(str(props.get("Handler", "")))
        if match is None:
            raise ExtractionError(f"{logical_id}: handler {props.get('Handler')!r} is not handlers.<module>")
        role = str(_ref_of(props["Role"]))
        if resources[role]["Properties"].get("ManagedPolicyArns"):
            raise ExtractionError(f"{role}: managed policies cannot be expanded offline; use statements")
        env = props.get("Environment", {}).get("Variables", {})
        module = match.group(1)
        if module in out:
            raise ExtractionError(f"two functions run handlers.{module}")
        out[module] = {
            "function": functions.get(logical_id, logical_id),
            "logical_id": logical_id,
            "role": role,
            "service": env.get("POWERTOOLS_SERVICE_NAME", ""),
            "statements": [_statement(s, render) for s in by_role.get(role, [])],
            "platform": platform.get(logical_id, []),
        }
    return {
        "about": ("Each Lambda function's role as the synthesized template grants it (default context, "
                  f"account {account}, region {region}, cluster {cluster} written as ${{account}}, "
                  "${region}, ${cluster}; ${<symbol>.Arn|Ref}: the stack's resources). Generated: "
                  f"{REGENERATE}. Read by local_mode/sim/contract/grants.py."),
        "functions": out,
    }


def _platform_needs(resources: Mapping[str, Any], render: _Renderer) -> dict[str, list[dict[str, str]]]:
    """function logical id -> what Lambda does with the function's role."""
    needs: dict[str, list[dict[str, str]]] = {}

    def add(function: str | None, actions: list[str], resource: str, why: str) -> None:
        for action in actions:
            needs.setdefault(str(function), []).append({"action": action, "resource": resource, "why": why})

    for logical_id, resource in sorted(resources.items()):
        props = resource.get("Properties", {})
        kind = resource["Type"]
        if kind == "AWS::Lambda::Function":
            group = props.get("LoggingConfig", {}).get("LogGroup")
            if group is not None:
                arn = (f"arn:aws:logs:${{region}}:${{account}}:log-group:{render.value(group)}"
                       ":log-stream:local")
                add(logical_id, ["logs:CreateLogStream", "logs:PutLogEvents"], arn,
                    "Lambda writes the function's logs to its log group with the function's role")
            if props.get("TracingConfig", {}).get("Mode") == "Active":
                add(logical_id, ["xray:PutTraceSegments", "xray:PutTelemetryRecords"], "*",
                    "active tracing: Lambda sends the function's segments (X-Ray has no resource-level "
                    "permissions)")
        elif kind == "AWS::Lambda::EventSourceMapping":
            source = render.value(props["EventSourceArn"])
            if ":sqs:" in source or source.startswith("${queue:"):
                add(_ref_of(props["FunctionName"]), ["sqs:ReceiveMessage", "sqs:DeleteMessage",
                                                      "sqs:GetQueueAttributes"], source,
                    "the SQS event source mapping polls and deletes with the function's role")
        elif kind == "AWS::Lambda::EventInvokeConfig":
            destination = props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
            if destination is not None:
                add(_ref_of(props["FunctionName"]), ["sqs:SendMessage"], render.value(destination),
                    "Lambda sends a failed asynchronous invocation to its on-failure destination with the "
                    "function's role")
    return needs


def from_stack(stack: Any, template: Mapping[str, Any]) -> dict[str, Any]:
    """The grants file's content (without variants) for a synthesized ``GpuRecoveryStack``
    and its template."""
    functions = {str(stack.resolve(fn.function.node.default_child.logical_id)): name
                 for name, fn in stack.functions.items()}
    config = stack.config
    return extract(template, stack_symbols(stack), functions=functions, region=str(stack.region),
                   account=str(stack.account), cluster=config.cluster_name,
                   tag=(config.instance_tag_key, config.instance_tag_value or config.cluster_name))


def variant_statements(name: str, stack: Any, template: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The statements variant ``name`` adds, per function: those of a synthesis with the
    variant's option on whose actions are all the variant's (:data:`VARIANTS`)."""
    prefixes = VARIANTS[name]["actions"]
    found: dict[str, list[dict[str, Any]]] = {}
    for module, entry in from_stack(stack, template)["functions"].items():
        own = [s for s in entry["statements"]
               if all(str(a).startswith(prefixes) for a in s.get("Action", []))]
        if own:
            found[module] = own
    return found


def synthesized(context: Mapping[str, str]) -> tuple[Any, dict[str, Any]]:
    """Synthesize the app with ``context`` (cdk-nag on: findings raise): (stack, template)."""
    import importlib
    import tempfile

    # Imported by name: mypy would otherwise follow aws_cdk's types (minutes of CPU on a cold
    # cache, why pyproject leaves infra/ out); the synthesis itself is checked by the infra tests.
    cdk: Any = importlib.import_module("aws_cdk")
    stack_app: Any = importlib.import_module("app")

    with tempfile.TemporaryDirectory() as outdir:
        app = cdk.App(outdir=outdir, context=dict(context))
        _, stack = stack_app.build_app(app, env=cdk.Environment(account=SYNTH_ACCOUNT, region=SYNTH_REGION))
        app.synth()
        template = json.loads((Path(outdir) / f"{stack_app.STACK_NAME}.template.json").read_text())
    return stack, template


def synthesize() -> dict[str, Any]:
    """The grants file's content: the default context and each variant's (~20 s each)."""
    content = from_stack(*synthesized(SYNTH_CONTEXT))
    content["variants"] = {name: variant_statements(name, *synthesized({**SYNTH_CONTEXT, **spec["context"]}))
                           for name, spec in VARIANTS.items()}
    return content


def read(path: Path = GRANTS_FILE) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def render_file(content: Mapping[str, Any]) -> str:
    return json.dumps(content, indent=1, sort_keys=False) + "\n"
