"""Condition, filter, update and key-condition expressions: parsed by moto's parsers once per
text (and names), bound to each call's values, validated and executed on this store's items."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from moto.dynamodb.comparisons import AttributeValue, ConditionExpressionParser
from moto.dynamodb.exceptions import DynamodbException
from moto.dynamodb.models.dynamo_type import Item
from moto.dynamodb.parsing.ast_nodes import (
    DepthFirstTraverser,
    ExpressionAttribute,
    ExpressionAttributeName,
    Node,
)
from moto.dynamodb.parsing.expressions import UpdateExpressionParser
from moto.dynamodb.parsing.validators import (
    ActionCountValidator,
    OverlappingPathsValidator,
    UpdateExpressionValidator,
    UpdateHashRangeKeyValidator,
)

from .values import _TOKEN, _from_moto, _validation


# ================================================================== expression caches
class _ConditionParser(ConditionExpressionParser):
    """moto's condition parser, split so the parsed tree is cached per expression and names,
    and attribute values are bound per call (moto looks them up while lexing)."""

    def _lookup_expression_attribute_value(self, name: str) -> dict[str, str]:
        return {"S": name}  # placeholder: bound in _make_operand from the node's text

    def tree(self) -> Any:
        nodes = self._lex_condition_expression()
        nodes = self._parse_paths(nodes)
        nodes = self._apply_functions(nodes)
        nodes = self._apply_comparator(nodes)
        nodes = self._apply_in(nodes)
        nodes = self._apply_between(nodes)
        nodes = self._apply_parens_and_booleans(nodes)
        node = nodes[0]
        self._assert_no_redundant_parentheses(node)
        return node

    def bind(self, node: Any) -> Any:
        return self._make_op_condition(node)

    def _make_operand(self, node: Any) -> Any:
        if node.kind == self.Kind.EXPRESSION_ATTRIBUTE_VALUE:
            values = self.expression_attribute_values or {}
            if node.text not in values:
                raise _validation("Invalid ConditionExpression: An expression attribute value used in "
                                  f"expression is not defined; attribute value: {node.text}")
            return AttributeValue(values[node.text])
        return super()._make_operand(node)


_cache_lock = threading.Lock()
_condition_trees: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_update_trees: dict[str, Any] = {}


def _condition(expression: str | None, names: Mapping[str, str] | None,
               values: Mapping[str, Any] | None, what: str = "ConditionExpression") -> Any:
    """The evaluable condition (``.expr(item) -> bool``), or None for no condition."""
    if not expression:
        return None
    key = (expression, tuple(sorted((names or {}).items())))
    with _cache_lock:
        tree = _condition_trees.get(key)
    if tree is None:
        parser = _ConditionParser(expression, dict(names or {}), {})
        try:
            tree = parser.tree()
        except KeyError as error:
            raise _validation(f"Invalid {what}: An expression attribute name used in the document path "
                              f"is not defined; attribute name: {error.args[0]}") from None
        except DynamodbException as error:
            raise _from_moto(error) from None
        except ValueError as error:
            raise _validation(f"Invalid {what}: {error}") from None
        with _cache_lock:
            _condition_trees[key] = tree
    parser = _ConditionParser(expression, dict(names or {}), dict(values or {}))
    try:
        return parser.bind(tree)
    except DynamodbException as error:
        raise _from_moto(error) from None


def _update_tree(expression: str) -> Any:
    """A fresh copy of the expression's parse (moto's validation rewrites it)."""
    return _clone_tree(_parsed_update(expression))


def _parsed_update(expression: str) -> Any:
    """The expression's parse, shared: not to be changed."""
    with _cache_lock:
        tree = _update_trees.get(expression)
    if tree is None:
        try:
            tree = UpdateExpressionParser.make(expression)
        except DynamodbException as error:
            raise _from_moto(error) from None
        _mark_kinds_below(tree, {})
        with _cache_lock:
            _update_trees[expression] = tree
    return tree


def _check_structure(tree: Any, names: dict[str, str], shape: Any, expression: str) -> None:
    """moto's structure checks (``_STRUCTURE_CHECKS``, in its order, raising its errors) on the
    expression's shared parse (``tree``): they read it and change nothing, so they run once
    per (expression, names, table key), as in :class:`_Validator`."""
    key = (expression, tuple(sorted(names.items())), tuple(shape.table_key_attrs))
    with _cache_lock:
        if key in _structure_passed:
            return
    put_in: set[type] = set()
    for processor in (ActionCountValidator(), OverlappingPathsValidator(names),
                      UpdateHashRangeKeyValidator(shape.table_key_attrs, names or {})):
        _traverse(_Pass(processor, put_in), tree)
    with _cache_lock:
        _structure_passed.add(key)


#: the attribute of a parsed update expression's nodes (and so of their clones) naming the node
#: classes in the node's subtree, itself included (see _traverse)
_KINDS_BELOW = "_local_mode_kinds_below"


def _mark_kinds_below(node: Any, interned: dict[frozenset[type], frozenset[type]]) -> frozenset[type]:
    kinds = {type(node)}
    if isinstance(node.children, list):
        for child in node.children:
            if _is_node(child):
                kinds |= _mark_kinds_below(child, interned)
    below = interned.setdefault(frozenset(kinds), frozenset(kinds))
    setattr(node, _KINDS_BELOW, below)
    return below


def _attribute_names(tree: Any, names: Mapping[str, str], expression: str | None = None) -> set[str]:
    """Every attribute name an update expression mentions (a superset of the top-level
    attributes it reads or writes: those are copied before it runs, the others shared).
    ``tree`` is the expression's parse, before validation (``_update_tree``): the answer
    depends only on the expression and its names, so with ``expression`` it is cached."""
    key = (expression, tuple(sorted(names.items()))) if expression is not None else None
    if key is not None:
        with _cache_lock:
            known = _names_of_update.get(key)
        if known is not None:
            return set(known)
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ExpressionAttribute):
            found.add(node.get_attribute_name())
        elif isinstance(node, ExpressionAttributeName):
            placeholder = node.get_attribute_name_placeholder()
            found.add(names.get(placeholder, placeholder))
        elif _is_node(node) and isinstance(node.children, list):
            stack.extend(node.children)
    if key is not None:
        with _cache_lock:
            _names_of_update[key] = frozenset(found)
    return found


_names_of_update: dict[tuple[str, tuple[tuple[str, str], ...]], frozenset[str]] = {}


def _is_node(value: Any) -> bool:
    """``isinstance(value, Node)`` (an ABC: its check was a tenth of an update's validation),
    cached per type."""
    kind = type(value)
    is_node = _node_types.get(kind)
    if is_node is None:
        is_node = _node_types[kind] = isinstance(value, Node)
    return is_node


def _clone_tree(node: Any, parent: Any = None) -> Any:
    """A copy of a parsed update expression (moto's validator rewrites the tree in place;
    ``copy.deepcopy`` costs as much as parsing again)."""
    clone = object.__new__(type(node))
    clone.__dict__.update(node.__dict__)
    clone.parent = parent
    if isinstance(node.children, list):
        clone.children = [_clone_tree(c, clone) if _is_node(c) else c for c in node.children]
    return clone


#: moto's update validators that read only the expression, its names and the table's key
#: attributes (never the values or the item), and change nothing: an expression they passed
#: once passes again, so they run once per (expression, names, key attributes)
_STRUCTURE_CHECKS = (ActionCountValidator, OverlappingPathsValidator, UpdateHashRangeKeyValidator)
_structure_passed: set[tuple[Any, ...]] = set()


class _Validator(UpdateExpressionValidator):
    """moto's update validator without its defensive deepcopy (we pass a fresh clone), its
    structure checks run once per expression (``_STRUCTURE_CHECKS``), and its traversals
    entering only the subtrees where the processor has something to process
    (:func:`_traverse`). Same processors, same order, same tree."""

    def __init__(self, tree: Any, names: dict[str, str], values: dict[str, Any], item: Item,
                 table: Any, expression: str = "") -> None:
        self.expression_attribute_names = names
        self.expression_attribute_values = values
        self.item = item
        self.table = table
        self.processors = self.get_ast_processors()
        self.node_to_validate = tree
        self._structure_key = (expression, tuple(sorted(names.items())), tuple(table.table_key_attrs)) \
            if expression else None

    def validate(self) -> Any:
        node = self.node_to_validate
        key = self._structure_key
        passed = key is not None and key in _structure_passed
        structural = [p for p in self.processors if isinstance(p, _STRUCTURE_CHECKS)]
        put_in: set[type] = set()  # the classes of the nodes processors put in the tree
        for processor in self.processors:
            if passed and isinstance(processor, _STRUCTURE_CHECKS):
                continue
            node = _traverse(_Pass(processor, put_in), node)
            if key is not None and not passed and processor is structural[-1]:
                with _cache_lock:
                    _structure_passed.add(key)
        return node


_node_types: dict[type, bool] = {}
#: per processor class: node class -> the first class of its processing map the node is an
#: instance of (moto's ``process``), or None
_handled_by: dict[type, dict[type, type | None]] = {}
#: per processor class: a set of node classes -> does the processor handle any of them
_handles_any: dict[type, dict[frozenset[type], bool]] = {}


class _Pass:
    """One processor's traversal of the tree."""

    __slots__ = ("handled_by", "handles_any", "pre", "processing", "prunes", "put_in")

    def __init__(self, processor: Any, put_in: set[type]) -> None:
        self.processing: dict[type, Any] = processor._processing_map()
        self.handled_by = _handled_by.setdefault(type(processor), {})
        self.handles_any = _handles_any.setdefault(type(processor), {})
        self.pre = _pre_processing(processor)
        self.put_in = put_in
        # A subtree of the parse with no node the processor handles is left unvisited: the
        # traversal would call nothing there (no pre_processing_of_child of its own) and
        # change nothing. Nodes put in by earlier processors are not in the parse's record
        # of a subtree's classes (_KINDS_BELOW): if the processor handles any of their
        # classes, every subtree is visited.
        self.prunes = self.pre is None and not self.handles(frozenset(put_in))

    def handled(self, kind: type) -> Any:
        handled_by = self.handled_by
        if kind in handled_by:
            return handled_by[kind]
        handled = handled_by[kind] = next((c for c in self.processing if issubclass(kind, c)), None)
        return handled

    def handles(self, kinds: frozenset[type]) -> bool:
        known = self.handles_any.get(kinds)
        if known is None:
            known = self.handles_any[kinds] = any(self.handled(kind) is not None for kind in kinds)
        return known


def _pre_processing(processor: Any) -> Any:
    """The processor's ``pre_processing_of_child``, or None where it is the traverser's own,
    which does nothing (all but one of the update validator's processors)."""
    hook = type(processor).pre_processing_of_child
    return None if hook is DepthFirstTraverser.pre_processing_of_child else processor.pre_processing_of_child


def _traverse(visit: _Pass, node: Any, child_id: int = -1) -> Any:
    """``DepthFirstTraverser.traverse_node_recursively`` with its ``isinstance`` tests (on
    ABCs, the validation's main cost) cached per node type, the processor's
    ``pre_processing_of_child`` called only where it does something (:func:`_pre_processing`),
    no call for a child that is not a node (moto's returns it untouched) and none for a
    subtree where the processor has nothing to process (:class:`_Pass`): the same
    processing in the same order."""
    kind = type(node)
    is_node = _node_types.get(kind)
    if is_node is None:
        is_node = _node_types[kind] = isinstance(node, Node)
    if not is_node:
        return node
    if visit.prunes:
        below = getattr(node, _KINDS_BELOW, None)
        if below is not None:
            handles = visit.handles_any.get(below)
            if handles is None:
                handles = visit.handles(below)
            if not handles:
                return node
    parent = node.parent
    children = node.children
    if children is not None:
        pre = visit.pre
        for i, child in enumerate(children):
            if pre is not None:
                pre(node, i)
            child_is_node = _node_types.get(type(child))
            if child_is_node is None:
                child_is_node = _node_types[type(child)] = isinstance(child, Node)
            if child_is_node:
                _traverse(visit, child, i)
    handled = visit.handled_by[kind] if kind in visit.handled_by else visit.handled(kind)
    if handled is not None:
        processed = visit.processing[handled](node)
        if processed is not node:
            visit.put_in.update(_kinds_in(processed))
        node = processed
        node.parent = parent
        if parent:
            parent.children[child_id] = node
    return node


def _kinds_in(tree: Any) -> set[type]:
    """The classes of the nodes in ``tree``."""
    found: set[type] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_node(node):
            found.add(type(node))
            if isinstance(node.children, list):
                stack.extend(node.children)
    return found


def _tokens(*expressions: str | None) -> set[str]:
    found: set[str] = set()
    for expression in expressions:
        if expression:
            found.update(_TOKEN.findall(expression))
    return found


def _check_tokens_used(params: Mapping[str, Any], *expressions: str | None) -> None:
    """DynamoDB refuses expression names / values that no expression uses."""
    used = _tokens(*expressions)
    for what, key in (("Names", "ExpressionAttributeNames"), ("Values", "ExpressionAttributeValues")):
        provided = params.get(key)
        if provided is None:
            continue
        if not provided:
            raise _validation(f"ExpressionAttribute{what} must not be empty")
        for name in provided:
            if name not in used:
                raise _validation(f"Value provided in ExpressionAttribute{what} unused in expressions: "
                                  f"keys: {{{name}}}")
