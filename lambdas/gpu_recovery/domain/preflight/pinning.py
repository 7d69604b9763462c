"""Pinning a failed preflight to the node(s) responsible: halves, then pairs.

A job's nodes are numbered 0..N-1 (a queue job's rank i runs on node i). Round 1 is the
preflight itself: every node's own loopback (an all-reduce over its GPUs: NVLink, the
node's GPUs under load) and then the gang all-reduce over all N. When the gang fails (an
error, a hang, or busbw under the baseline) and no loopback explains it, the fault is
between nodes: a node's own network path (every group holding it and another node is
slow) or the link between two nodes (only groups holding both are slow). Later rounds run
all-reduces over **disjoint** groups of nodes at once (a node takes part in at most one
group per round), and each group passes or fails.

The search keeps a few *problems*, each a set of hypotheses:

* ``within(S)``: the fault is inside S (S's all-reduce failed). Split S into halves A, B
  and test both: A fails -> ``within(A)``; B fails -> ``within(B)``; both pass -> the fault is
  a link with one end in each: ``cross(A, B)``. A half of one node is tested with a partner
  (a node known good, else one outside every suspect set). Two nodes {u, v} left: test
  {u, g1} and {v, g2} with good partners: the one that fails is pinned for its own path;
  both pass -> the link u-v, both ends pinned. With no partner at all (a 2-node job) both
  ends are pinned: the test cannot tell a node's path from the link between the two.
* ``cross(A, B)``: one end in A, the other in B, no node path at fault. Test A1+B1 and
  A2+B2 (halves): one fails -> ``cross`` of those halves; both pass -> ``crossx``, the
  link is in A1xB2 or A2xB1, tested next round as A1+B2 and A2+B1.
* ``involves(x, C)``: x's own path, or a link from x into C (a lone node no partner could
  test). Test x+C1: fails -> ``involves(x, C1)``; passes -> ``cross({x}, C2)``. With C one
  node c: x with a good partner: fails -> x's path, passes -> the link x-c.

Rounds (proved by induction on the halving, and checked exhaustively by the tests and
``make bench``). Let m = ceil(log2 N), N >= 4, one fault:

* a node's own path, or a link whose ends share a half at every split: rounds 2..m halve
  N down to 2 nodes (a half has at most ceil(N / 2^k) nodes after k splits), round m+1 is
  the pair round: **at most m + 1 rounds**;
* any link: it may cross at a split; from there each halving of both sides takes at most
  two rounds (``cross``, then ``crossx``): **at most 2m rounds**.

m + 1 rounds for *every* link is not reachable with disjoint groups that only pass or fail:
for N = 4 the 6 links cannot be told apart in 3 rounds (a round's two groups of two leave
the four crossing links to one outcome, and one more round splits them at most in three);
in general, once halves pass, A x B holds |A||B| candidate links and any round of disjoint
groups keeps at least a 1/2.62 share of them in one outcome (if every outcome kept at most
a share 1/c, sum |G_i n A||G_i n B| <= n^2 / sqrt(c), so the "none fails" outcome keeps at
least n^2 (1 - 1/sqrt(c)), which is below n^2 / c only for c < 2.62), so about
1.44 log2(N^2/4) more rounds are needed: 10 at N = 128 against m + 1 = 8.

**No healthy node is pinned** as long as there is one fault and the measurements are
consistent: a node is pinned only when a test with a partner not in any suspect set fails
(its own path), or it is an end of the last candidate link. An outcome the single-fault
model cannot explain (both groups of a ``crossx`` pass: the failure went away) pins
nothing and is reported; so do faults in more than :data:`MAX_PROBLEMS` places or more than
:data:`MAX_PINNED` nodes to pin: that is the fabric (or the baseline), not a few nodes.

Pure, and small in storage: node sets are spans of node numbers (``[lo, hi)``), so the
state does not grow with N.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

Span = tuple[int, int]  # [lo, hi)
NodeSet = tuple[Span, ...]

MAX_PROBLEMS = 4  # separate places at fault at once; more: the fabric, not a node
MAX_PINNED = 4  # nodes one preflight may pin; more: the fabric, or the baseline


# ------------------------------------------------------------------------ node sets
def nodeset(nodes: Iterable[int]) -> NodeSet:
    """Sorted, merged spans of ``nodes``."""
    spans: list[list[int]] = []
    for n in sorted(set(nodes)):
        if spans and spans[-1][1] == n:
            spans[-1][1] = n + 1
        else:
            spans.append([n, n + 1])
    return tuple((lo, hi) for lo, hi in spans)


def span_set(lo: int, hi: int) -> NodeSet:
    return ((lo, hi),) if hi > lo else ()


def size(s: NodeSet) -> int:
    return sum(hi - lo for lo, hi in s)


def members(s: NodeSet) -> list[int]:
    return [n for lo, hi in s for n in range(lo, hi)]


def contains(s: NodeSet, node: int) -> bool:
    return any(lo <= node < hi for lo, hi in s)


def union(*sets: NodeSet) -> NodeSet:
    return _merge([span for s in sets for span in s])


def _merge(spans: list[Span]) -> NodeSet:
    out: list[list[int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out if hi > lo)


def halves(s: NodeSet) -> tuple[NodeSet, NodeSet]:
    """The first ceil(n/2) members and the rest, as spans."""
    want = (size(s) + 1) // 2
    first: list[Span] = []
    rest: list[Span] = []
    taken = 0
    for lo, hi in s:
        if taken >= want:
            rest.append((lo, hi))
            continue
        cut = min(hi, lo + (want - taken))
        first.append((lo, cut))
        taken += cut - lo
        if cut < hi:
            rest.append((cut, hi))
    return tuple(first), tuple(rest)


def first(s: NodeSet) -> int:
    return s[0][0]


def describe(s: NodeSet) -> str:
    return ",".join(f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}" for lo, hi in s) or "-"


def _pack(s: NodeSet) -> list[list[int]]:
    return [[lo, hi] for lo, hi in s]


def _unpack(raw: Any) -> NodeSet:
    return _merge([(int(p[0]), int(p[1])) for p in raw or ()])


# ------------------------------------------------------------------------ problems
WITHIN, CROSS, CROSSX, INVOLVES = "within", "cross", "crossx", "involves"


@dataclass(frozen=True)
class Problem:
    """Hypotheses about one fault. ``sets``: within (S,); cross (A, B); crossx (A1, B2, A2, B1);
    involves ({x}, C)."""

    kind: str
    sets: tuple[NodeSet, ...]

    @property
    def nodes(self) -> NodeSet:
        return union(*self.sets)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "sets": [_pack(s) for s in self.sets]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Problem:
        return cls(str(raw["kind"]), tuple(_unpack(s) for s in raw.get("sets") or ()))

    def __str__(self) -> str:
        if self.kind == WITHIN:
            return f"within {describe(self.sets[0])}"
        if self.kind == CROSS:
            return f"a link {describe(self.sets[0])} x {describe(self.sets[1])}"
        if self.kind == CROSSX:
            a1, b2, a2, b1 = self.sets
            return f"a link {describe(a1)} x {describe(b2)} or {describe(a2)} x {describe(b1)}"
        return f"node {describe(self.sets[0])} or its link into {describe(self.sets[1])}"


@dataclass(frozen=True)
class Pin:
    """A node pinned, and why (its own path, the link to ``peer``, its loopback...)."""

    node: int
    reason: str
    peer: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "reason": self.reason}
        return out if self.peer is None else {**out, "peer": self.peer}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Pin:
        peer = raw.get("peer")
        return cls(int(raw["node"]), str(raw.get("reason") or ""), None if peer is None else int(peer))


@dataclass(frozen=True)
class GroupTest:
    """One all-reduce of a round: its id (``t<n>``), its nodes, which problem it serves and
    what it tells (``role``)."""

    test_id: str
    nodes: NodeSet
    problem: int
    role: str
    partner: int | None = None  # a good node padding a lone suspect

    @property
    def size(self) -> int:
        return size(self.nodes)

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.test_id, "nodes": _pack(self.nodes), "problem": self.problem, "role": self.role}
        return out if self.partner is None else {**out, "partner": self.partner}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> GroupTest:
        partner = raw.get("partner")
        return cls(str(raw["id"]), _unpack(raw["nodes"]), int(raw["problem"]), str(raw["role"]),
                   None if partner is None else int(partner))


@dataclass(frozen=True)
class PinState:
    """Where the search is: its problems, the nodes known good, the nodes pinned."""

    nodes: int
    problems: tuple[Problem, ...] = ()
    known_good: NodeSet = ()
    pinned: tuple[Pin, ...] = ()
    round: int = 1
    notes: tuple[str, ...] = ()  # outcomes the single-fault model could not explain
    widespread: str = ""  # set: too many places at fault; nothing pinned

    @property
    def done(self) -> bool:
        return not self.problems or bool(self.widespread)

    @property
    def pinned_nodes(self) -> list[int]:
        return sorted({p.node for p in self.pinned})

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "problems": [p.to_dict() for p in self.problems],
                "known_good": _pack(self.known_good), "pinned": [p.to_dict() for p in self.pinned],
                "round": self.round, "notes": list(self.notes[-8:]), "widespread": self.widespread}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PinState:
        return cls(nodes=int(raw["nodes"]),
                   problems=tuple(Problem.from_dict(p) for p in raw.get("problems") or ()),
                   known_good=_unpack(raw.get("known_good")),
                   pinned=tuple(Pin.from_dict(p) for p in raw.get("pinned") or ()),
                   round=int(raw.get("round") or 1), notes=tuple(str(n) for n in raw.get("notes") or ()),
                   widespread=str(raw.get("widespread") or ""))


# ------------------------------------------------------------------------ round 1
def after_first_round(nodes: int, *, gang_passed: bool, loopback_failed: Iterable[int] = (),
                      missing: Iterable[int] = ()) -> PinState:
    """The state after the preflight itself (round 1): nothing to search when it passed; the
    nodes whose own loopback failed, or that never reported, pinned at once (a node-local
    fault explains the gang's failure: no search on top); else the search over all N."""
    local = sorted(set(loopback_failed))
    silent = sorted(set(missing) - set(local))
    pins = tuple([Pin(n, "its own loopback (single-node all-reduce) failed") for n in local]
                 + [Pin(n, "it never reported its preflight (hung or not started)") for n in silent])
    state = PinState(nodes=nodes, round=1)
    if pins:
        if len(pins) > MAX_PINNED:
            return replace(state, widespread=f"{len(pins)} nodes failed on their own (more than "
                                             f"{MAX_PINNED}): the fabric or the baseline, not a few nodes")
        return replace(state, pinned=pins)
    if gang_passed or nodes < 2:
        return state
    if nodes == 2:
        return replace(state, pinned=(Pin(0, "the only link tested, to node 1, was slow or failed", 1),
                                      Pin(1, "the only link tested, to node 0, was slow or failed", 0)))
    return replace(state, problems=(Problem(WITHIN, (span_set(0, nodes),)),))


# ------------------------------------------------------------------------ a round
def _suspects(state: PinState) -> NodeSet:
    return union(*(p.nodes for p in state.problems), nodeset(p.node for p in state.pinned))


class _Partners:
    """Good nodes to pad a lone suspect with: tested good first, then any node outside every
    suspect set (good unless there is a second fault). One test each per round."""

    def __init__(self, state: PinState) -> None:
        suspects = _suspects(state)
        known = [n for n in members(state.known_good) if not contains(suspects, n)]
        known_set = set(known)
        rest = [n for n in range(state.nodes) if n not in known_set and not contains(suspects, n)]
        self._queue = known + rest

    def take(self, avoid: Iterable[int] = ()) -> int | None:
        banned = set(avoid)
        for i, n in enumerate(self._queue):
            if n not in banned:
                return self._queue.pop(i)
        return None


def plan_round(state: PinState) -> list[GroupTest]:
    """The next round's tests (disjoint groups), one or two per problem."""
    partners = _Partners(state)
    tests: list[GroupTest] = []

    def add(nodes: NodeSet, problem: int, role: str, partner: int | None = None) -> None:
        tests.append(GroupTest(f"t{len(tests) + 1}", nodes, problem, role, partner))

    for i, problem in enumerate(state.problems):
        if problem.kind == WITHIN:
            (s,) = problem.sets
            if size(s) == 2:
                u, v = members(s)
                g1 = partners.take()
                g2 = partners.take()
                if g1 is not None:
                    add(nodeset([u, g1]), i, "pair_u", g1)
                if g2 is not None:
                    add(nodeset([v, g2]), i, "pair_v", g2)
                continue
            a, b = halves(s)
            add(a, i, "half_a")
            if size(b) >= 2:
                add(b, i, "half_b")
            else:
                g = partners.take()
                if g is not None:
                    add(union(b, nodeset([g])), i, "half_b", g)
        elif problem.kind == CROSS:
            a, b = problem.sets
            if size(a) >= 2 and size(b) >= 2:
                a1, _a2 = halves(a)
                b1, _b2 = halves(b)
                add(union(a1, b1), i, "cross_11")
                add(union(_a2, _b2), i, "cross_22")
            elif size(a) == 1:
                b1, _ = halves(b)
                add(union(a, b1), i, "cross_a1")
            else:
                a1, _ = halves(a)
                add(union(a1, b), i, "cross_1b")
        elif problem.kind == CROSSX:
            a1, b2, a2, b1 = problem.sets
            add(union(a1, b2), i, "crossx_12")
            add(union(a2, b1), i, "crossx_21")
        elif problem.kind == INVOLVES:
            x, c = problem.sets
            if size(c) == 1:
                g = partners.take(avoid=members(c))
                if g is not None:
                    add(union(x, nodeset([g])), i, "involves_partner", g)
            else:
                c1, _ = halves(c)
                add(union(x, c1), i, "involves_half")
    return tests


def _link(a: int, b: int) -> tuple[Pin, Pin]:
    return (Pin(a, f"the link to node {b} is slow or fails", b),
            Pin(b, f"the link to node {a} is slow or fails", a))


def _either(a: int, b: int) -> tuple[Pin, Pin]:
    why = "it or its link to node {} fails (no other node to tell them apart)"
    return Pin(a, why.format(b), b), Pin(b, why.format(a), a)


def _own(node: int) -> Pin:
    return Pin(node, "its own network path: every group holding it and another node fails")


def _cross_or_pin(a: NodeSet, b: NodeSet) -> tuple[list[Problem], list[Pin]]:
    if size(a) == 1 and size(b) == 1:
        return [], list(_link(first(a), first(b)))
    return [Problem(CROSS, (a, b))], []


def _failed_crossings(*pairs: tuple[bool | None, NodeSet, NodeSet]) -> tuple[list[Problem], list[Pin]]:
    """For each (result, a, b) whose all-reduce failed: the link between a and b is next."""
    new: list[Problem] = []
    pins: list[Pin] = []
    for passed, a, b in pairs:
        if passed is False:
            more, p = _cross_or_pin(a, b)
            new += more
            pins += p
    return new, pins


def advance(state: PinState, tests: Sequence[GroupTest], passed: Mapping[str, bool]) -> PinState:
    """The state after a round: ``passed`` says, per test id, whether its all-reduce passed
    (a test missing from it did not report in time: it failed)."""
    ok = {t.test_id: bool(passed.get(t.test_id, False)) for t in tests}
    by_problem: dict[int, dict[str, GroupTest]] = {}
    for t in tests:
        by_problem.setdefault(t.problem, {})[t.role] = t
    problems: list[Problem] = []
    pins: list[Pin] = list(state.pinned)
    good: list[NodeSet] = [state.known_good]
    notes = list(state.notes)
    for t in tests:
        if ok[t.test_id] and t.size >= 2:
            good.append(t.nodes)
    for i, problem in enumerate(state.problems):
        roles = by_problem.get(i, {})
        new, pinned, note = _advance_one(problem, roles, ok)
        problems += new
        pins += pinned
        if note:
            notes.append(f"round {state.round + 1}: {note}")
    known = union(*good)
    out = replace(state, problems=tuple(problems), pinned=tuple(_dedupe(pins)), known_good=known,
                  round=state.round + 1, notes=tuple(notes[-8:]))
    if len(out.problems) > MAX_PROBLEMS or len(out.pinned_nodes) > MAX_PINNED:
        where = len(out.problems) + len(out.pinned_nodes)
        return replace(out, problems=(), pinned=(), widespread=(
            f"faults in {where} places (more than {MAX_PROBLEMS} open or {MAX_PINNED} nodes): the "
            "fabric or the baseline, not a few nodes"))
    return out


def _dedupe(pins: Iterable[Pin]) -> list[Pin]:
    seen: dict[int, Pin] = {}
    for p in pins:
        seen.setdefault(p.node, p)
    return list(seen.values())


def _advance_one(problem: Problem, roles: Mapping[str, GroupTest], ok: Mapping[str, bool]
                 ) -> tuple[list[Problem], list[Pin], str]:
    def result(role: str) -> bool | None:
        t = roles.get(role)
        return None if t is None else ok[t.test_id]

    if problem.kind == WITHIN:
        (s,) = problem.sets
        if size(s) == 2:
            u, v = members(s)
            ru, rv = result("pair_u"), result("pair_v")
            if ru is None and rv is None:  # no partner at all: both ends
                return [], list(_either(u, v)), ""
            if ru is False or rv is False:
                return [], [_own(n) for n, r in ((u, ru), (v, rv)) if r is False], ""
            if ru and rv:
                return [], list(_link(u, v)), ""
            # one partner only, and u passed with it: v's own path, or the link u-v
            return [Problem(INVOLVES, (nodeset([v]), nodeset([u])))], [], ""
        a, b = halves(s)
        ra, rb = result("half_a"), result("half_b")
        padded = roles.get("half_b") is not None and roles["half_b"].partner is not None
        new: list[Problem] = []
        pins: list[Pin] = []
        if ra is False:
            new.append(Problem(WITHIN, (a,)))
        if rb is False:
            if padded:
                pins.append(_own(first(b)))  # b alone with a good partner: its own path
            else:
                new.append(Problem(WITHIN, (b,)))
        if ra and rb:
            more, p = _cross_or_pin(b, a)
            new += more
            pins += p
        if ra and rb is None:  # a lone node nobody could pad: it, or its link into A
            new.append(Problem(INVOLVES, (b, a)))
        return new, pins, ""
    if problem.kind == CROSS:
        a, b = problem.sets
        if size(a) >= 2 and size(b) >= 2:
            a1, a2 = halves(a)
            b1, b2 = halves(b)
            r11, r22 = result("cross_11"), result("cross_22")
            new, pins = _failed_crossings((r11, a1, b1), (r22, a2, b2))
            if r11 and r22:
                new.append(Problem(CROSSX, (a1, b2, a2, b1)))
            return new, pins, ""
        if size(a) == 1:
            b1, b2 = halves(b)
            more, p = _cross_or_pin(a, b1) if result("cross_a1") is False else _cross_or_pin(a, b2)
            return more, p, ""
        a1, a2 = halves(a)
        more, p = _cross_or_pin(a1, b) if result("cross_1b") is False else _cross_or_pin(a2, b)
        return more, p, ""
    if problem.kind == CROSSX:
        a1, b2, a2, b1 = problem.sets
        r12, r21 = result("crossx_12"), result("crossx_21")
        new, pins = _failed_crossings((r12, a1, b2), (r21, a2, b1))
        if r12 and r21:
            return [], [], f"{problem}: every group passed this time (a flapping link?): nothing pinned"
        return new, pins, ""
    # INVOLVES
    x, c = problem.sets
    if size(c) == 1:
        r = result("involves_partner")
        if r is None:  # no partner left anywhere: both
            return [], list(_either(first(x), first(c))), ""
        if r is False:
            return [], [_own(first(x))], ""
        return [], list(_link(first(x), first(c))), ""
    c1, c2 = halves(c)
    if result("involves_half") is False:
        return [Problem(INVOLVES, (x, c1))], [], ""
    more, p = _cross_or_pin(x, c2)
    return more, p, ""


# ------------------------------------------------------------------------ the model
@dataclass(frozen=True)
class Fault:
    """A simulated fault for :func:`simulate`: a node's own path (``nodes`` one node), a
    link (two nodes), or a node's loopback (``loopback`` True)."""

    nodes: tuple[int, ...]
    loopback: bool = False

    def fails(self, group: Iterable[int]) -> bool:
        g = set(group)
        if self.loopback:
            return False  # a node-local fault shows in the loopback, and in the gang
        if len(self.nodes) == 1:
            return self.nodes[0] in g and len(g) >= 2
        return set(self.nodes) <= g


@dataclass
class SearchRun:
    rounds: int
    pinned: list[int]
    widespread: str = ""
    notes: list[str] = field(default_factory=list)


def simulate(nodes: int, faults: Sequence[Fault], max_rounds: int = 64) -> SearchRun:
    """The search against a model fabric: a group fails when a fault holds it. Rounds count
    the preflight itself (round 1)."""
    loopbacks = [n for f in faults if f.loopback for n in f.nodes]
    gang = list(range(nodes))
    gang_failed = bool(loopbacks) or any(f.fails(gang) for f in faults)
    state = after_first_round(nodes, gang_passed=not gang_failed, loopback_failed=loopbacks)
    while not state.done and state.round < max_rounds:
        tests = plan_round(state)
        outcome = {t.test_id: not any(f.fails(members(t.nodes)) for f in faults) for t in tests}
        state = advance(state, tests, outcome)
    return SearchRun(state.round, state.pinned_nodes, state.widespread, list(state.notes))
