"""The step graph: indexing, the graph-level static checks, and drawing.

A definition has one top-level graph plus one per loop body and one per map
template (the template alone). Step ids are unique across all of them.

- `index_steps` lists every step with its graph and owner, reporting duplicate ids.
- `check_graph` reports unknown or foreign ``depends_on`` / switch targets,
  impossible ``join`` counts and dependency cycles (with the cycle path).
- `never_running` finds steps that can never run (constant-false ``when``,
  propagated through joins and the exclusive branches of a switch).
- `to_mermaid` and `to_dot` draw a compiled `Plan`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tideflow.dsl.loader import DataPath, Reporter, did_you_mean
from tideflow.model.plan import Graph, Plan, StepSpec

__all__ = [
    "HOLE",
    "StepEntry",
    "StepIndex",
    "build_graph",
    "check_graph",
    "index_steps",
    "never_running",
    "to_dot",
    "to_mermaid",
]

_MERMAID_KEYWORDS = frozenset(
    {"end", "graph", "subgraph", "flowchart", "style", "class", "classdef", "click"}
    | {"linkstyle", "default", "direction", "call", "href"}
)

TOP = ""
"""The top level's graph key; a loop body's key is the loop id, a map template's the map id."""

HOLE = "\x00hole"
"""The id prefix of a step `salvage.salvage` could not use: not indexed, never reported."""


@dataclass(frozen=True, slots=True)
class StepEntry:
    id: str
    data: Mapping[str, Any]
    """The normalised step."""
    path: DataPath
    graph: str
    owner: str | None


@dataclass
class StepIndex:
    entries: dict[str, StepEntry] = field(default_factory=dict)
    graphs: dict[str, list[str]] = field(default_factory=lambda: {TOP: []})
    _bits: dict[str, int] = field(default_factory=dict)
    _ancestors: dict[str, int] = field(default_factory=dict)
    _order: dict[str, list[str]] = field(default_factory=dict)

    def deps(self, step_id: str) -> list[str]:
        """Known dependencies in the step's own graph."""
        entry = self.entries[step_id]
        return [d for d in entry.data.get("depends_on", ()) if self.in_graph(d, entry.graph)]

    def in_graph(self, step_id: str, graph: str) -> bool:
        entry = self.entries.get(step_id)
        return entry is not None and entry.graph == graph

    def topological(self, graph: str) -> list[str]:
        """The graph's steps in dependency order (Kahn); steps on a cycle are left out."""
        cached = self._order.get(graph)
        if cached is None:
            steps = self.graphs.get(graph, [])
            waiting = {s: len(set(self.deps(s))) for s in steps}
            dependents: dict[str, list[str]] = {s: [] for s in steps}
            for step in steps:
                for dep in set(self.deps(step)):
                    dependents[dep].append(step)
            ready = deque(s for s in steps if waiting[s] == 0)
            cached = self._order[graph] = []
            while ready:
                step = ready.popleft()
                cached.append(step)
                for later in dependents[step]:
                    waiting[later] -= 1
                    if waiting[later] == 0:
                        ready.append(later)
        return cached

    def depends_on(self, step_id: str, target: str) -> bool:
        """Whether ``step_id`` transitively depends on ``target`` (within one graph)."""
        return bool(self._ancestor_bits(step_id) & self._bit(target))

    def can_read(self, step_id: str, target: str) -> bool:
        """``target`` is a transitive dependency of ``step_id`` or of a loop/map owning it."""
        current: str | None = step_id
        while current is not None:
            if self.depends_on(current, target):
                return True
            current = self.entries[current].owner
        return False

    def _bit(self, step_id: str) -> int:
        if not self._bits:
            self._bits = {s: 1 << i for i, s in enumerate(self.entries)}
        return self._bits[step_id]

    def _ancestor_bits(self, step_id: str) -> int:
        """Ancestors as a bit set, computed for a whole graph at once in dependency order."""
        if step_id not in self._ancestors:
            steps = self.graphs[self.entries[step_id].graph]
            unknown = sum(self._bit(s) for s in steps)  # a step on a cycle may read anything
            self._ancestors.update(dict.fromkeys(steps, unknown))
            for step in self.topological(self.entries[step_id].graph):
                bits = 0
                for dep in self.deps(step):
                    bits |= self._ancestors[dep] | self._bit(dep)
                self._ancestors[step] = bits
        return self._ancestors[step_id]


def index_steps(normal: Mapping[str, Any], report: Reporter) -> StepIndex:
    index = StepIndex()
    dropped: list[DataPath] = []
    for i, step in enumerate(normal["steps"]):
        for entry in _walk(step, ("steps", i), TOP, None):
            if entry.id.startswith(HOLE) or any(entry.path[: len(d)] == d for d in dropped):
                continue
            first = index.entries.get(entry.id)
            if first is not None:
                _duplicate(report, first, entry)
                dropped.append(entry.path)
                continue
            index.entries[entry.id] = entry
            index.graphs.setdefault(entry.graph, []).append(entry.id)
            if entry.data["type"] in ("loop", "map"):
                index.graphs.setdefault(entry.id, [])
    return index


def _walk(
    step: Mapping[str, Any], path: DataPath, graph: str, owner: str | None
) -> Iterator[StepEntry]:
    yield StepEntry(step["id"], step, path, graph, owner)
    if step["type"] == "loop":
        for j, child in enumerate(step["steps"]):
            yield from _walk(child, (*path, "steps", j), step["id"], step["id"])
    elif step["type"] == "map":
        yield from _walk(step["step"], (*path, "step"), step["id"], step["id"])


def _duplicate(report: Reporter, first: StepEntry, again: StepEntry) -> None:
    lines = [report.positions.find((*e.path, "id")) for e in (first, again)]
    where = " and ".join(str(p[0]) for p in lines if p) or "two places"
    report.error(
        (*again.path, "id"),
        f"duplicate step id '{again.id}' (defined on lines {where})",
        hint="step ids must be unique across the whole definition, loop bodies and map "
        "templates included; rename one of them",
        step_id=again.id,
    )


# --- static checks ----------------------------------------------------------------


def check_graph(index: StepIndex, report: Reporter) -> bool:
    """Report unknown targets, impossible joins and cycles; False when a cycle was found."""
    for entry in index.entries.values():
        _check_targets(index, report, entry)
        _check_join(index, report, entry)
    acyclic = True
    for graph in index.graphs:
        for cycle in _cycles(index, graph):
            acyclic = False
            _report_cycle(index, report, cycle)
    return acyclic


def _targets(entry: StepEntry) -> Iterator[tuple[DataPath, str]]:
    data = entry.data
    for j, dep in enumerate(data.get("depends_on", ())):
        yield ("depends_on", j), dep
    for i, case in enumerate(data.get("cases", ())):
        for j, target in enumerate(case["next"]):
            yield ("cases", i, "next", j), target
    if isinstance(data.get("default"), list):
        for j, target in enumerate(data["default"]):
            yield ("default", j), target


def _check_targets(index: StepIndex, report: Reporter, entry: StepEntry) -> None:
    for where, target in _targets(entry):
        path, kind = (*entry.path, *where), "depends_on" if where[0] == "depends_on" else "next"
        if target == entry.id and kind == "next":
            report.error(
                path,
                f"switch '{entry.id}' targets itself",
                hint="remove it from the targets",
                step_id=entry.id,
            )
        elif target in index.entries and not index.in_graph(target, entry.graph):
            other = index.entries[target]
            inside = f"inside '{other.graph}'" if other.graph else "at the top level"
            report.error(
                path,
                f"'{target}' is {inside}, not in the same graph as '{entry.id}'",
                hint=f"{kind} may only name steps at the same level (top level or same loop body)",
                step_id=entry.id,
            )
        elif target not in index.entries:
            siblings = [s for s in index.graphs.get(entry.graph, ()) if s != entry.id]
            suggestion = did_you_mean(target, siblings)
            hint = (
                f"did you mean '{suggestion}'?"
                if suggestion
                else f"known steps here: {', '.join(siblings) or '(none)'}"
            )
            report.error(path, f"{kind} names unknown step '{target}'", hint=hint, step_id=entry.id)


def _check_join(index: StepIndex, report: Reporter, entry: StepEntry) -> None:
    join = entry.data.get("join")
    deps = len(entry.data.get("depends_on", ()))
    if isinstance(join, dict) and join["at_least"] > deps:
        report.error(
            (*entry.path, "join", "at_least"),
            f"join needs {join['at_least']} dependencies to succeed, but '{entry.id}' has {deps}",
            hint=f"use at_least between 1 and {deps}, or add dependencies",
            step_id=entry.id,
        )


def _cycles(index: StepIndex, graph: str) -> list[list[str]]:
    """One cycle per set of steps that form one, in definition order (iterative DFS)."""
    state: dict[str, int] = {}
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for root in index.graphs[graph]:
        if root in state:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(index.deps(root)))]
        state[root] = 1
        while stack:
            node, deps = stack[-1]
            dep = next(deps, None)
            if dep is None:
                state[node] = 2
                stack.pop()
            elif state.get(dep) == 1:
                trail = [n for n, _ in stack]
                cycle = trail[trail.index(dep) :]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    found.append(cycle)
            elif dep not in state:
                state[dep] = 1
                stack.append((dep, iter(index.deps(dep))))
    return found


def _report_cycle(index: StepIndex, report: Reporter, cycle: list[str]) -> None:
    """``cycle`` follows depends_on edges; print it in execution order, a -> b meaning b needs a."""
    order = list(index.entries)
    first = min(range(len(cycle)), key=lambda i: order.index(cycle[i]))
    ring = cycle[first:] + cycle[:first]
    text = " -> ".join([ring[0], *reversed(ring[1:]), ring[0]])
    entry = index.entries[ring[0]]
    dep = ring[1] if len(ring) > 1 else ring[0]
    deps = list(entry.data.get("depends_on", ()))
    path = (*entry.path, "depends_on", deps.index(dep)) if dep in deps else entry.path
    report.error(
        path,
        f"dependency cycle: {text}",
        hint="a step cannot depend on itself, directly or through others (switch targets "
        "depend on their switch); remove one dependency, or repeat work with a loop step",
        step_id=entry.id,
    )


# --- steps that can never run -------------------------------------------------------


def never_running(index: StepIndex, false_when: set[str]) -> dict[str, str]:
    """Step id -> why it can never run. Call only on acyclic graphs."""
    never: dict[str, str] = dict.fromkeys(false_when, "its `when` is always false")
    for graph in index.graphs:
        for step_id in index.topological(graph):
            if step_id not in never:
                reason = _blocked(index, graph, step_id, never)
                if reason:
                    never[step_id] = reason
    return never


def _blocked(index: StepIndex, graph: str, step_id: str, never: Mapping[str, str]) -> str | None:
    deps = index.deps(step_id)
    if not deps:
        return None
    live = [d for d in deps if d not in never]
    join = index.entries[step_id].data.get("join", "all")
    if not live:
        return "none of its dependencies can ever run"
    if isinstance(join, dict):
        possible = _max_succeeding(index, graph, live)
        if possible < join["at_least"]:
            return (
                f"its join needs {join['at_least']} dependencies to succeed, but at most "
                f"{possible} can (targets of one switch exclude each other)"
            )
    return None


def _max_succeeding(index: StepIndex, graph: str, deps: list[str]) -> int:
    """How many of ``deps`` can succeed in one run, given that switch branches are exclusive."""
    switches = [index.entries[s].data for s in index.graphs[graph]]
    switches = [s for s in switches if s["type"] == "switch"]
    targeted: dict[str, list[Mapping[str, Any]]] = {}
    for switch in switches:
        for target in _switch_targets(switch):
            targeted.setdefault(target, []).append(switch)
    free = [d for d in deps if len(targeted.get(d, ())) != 1]
    total = len(free)
    for switch in switches:
        mine = {d for d in deps if targeted.get(d) == [switch]}
        if mine:
            total += max(len(mine & branch) for branch in _branches(switch))
    return total


def _branches(switch: Mapping[str, Any]) -> list[set[str]]:
    branches = [set(case["next"]) for case in switch["cases"]]
    return branches + ([set(switch["default"])] if isinstance(switch["default"], list) else [])


def _switch_targets(switch: Mapping[str, Any]) -> set[str]:
    return set().union(*_branches(switch))


def build_graph(index: StepIndex, graph: str) -> Graph:
    steps = tuple(index.graphs.get(graph, ()))
    dependents: dict[str, list[str]] = {s: [] for s in steps}
    for step in steps:
        for dep in index.deps(step):
            dependents[dep].append(step)
    return Graph(
        steps=steps,
        dependents={s: tuple(d) for s, d in dependents.items()},
        roots=tuple(s for s in steps if not index.deps(s)),
        sinks=tuple(s for s in steps if not dependents[s]),
    )


# --- drawing --------------------------------------------------------------------------


def to_mermaid(plan: Plan) -> str:
    """A Mermaid ``flowchart TD``; loop bodies and map templates are subgraphs."""
    lines = ["flowchart TD"]
    _mermaid_graph(plan, plan.graph.steps, lines, "  ")
    for spec in plan.specs.values():
        for source, target, label in _edges(plan, spec):
            arrow = f'-->|"{_mermaid_text(label)}"|' if label else "-->"
            lines.append(f"  {_mermaid_id(source)} {arrow} {_mermaid_id(target)}")
    return "\n".join(lines) + "\n"


def _mermaid_graph(plan: Plan, steps: tuple[str, ...], lines: list[str], indent: str) -> None:
    for step_id in steps:
        spec = plan.specs[step_id]
        label = _mermaid_text(f"{spec.id} ({spec.type})")
        nested = _nested(plan, spec)
        if nested is None:
            shape = f'{{"{label}"}}' if spec.type == "switch" else f'["{label}"]'
            lines.append(f"{indent}{_mermaid_id(spec.id)}{shape}")
            continue
        lines.append(f'{indent}subgraph {_mermaid_id(spec.id)}["{label}"]')
        _mermaid_graph(plan, nested, lines, indent + "  ")
        lines.append(f"{indent}end")


def _mermaid_id(step_id: str) -> str:
    return f"step_{step_id}" if step_id in _MERMAID_KEYWORDS else step_id


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("\n", " ")


def to_dot(plan: Plan) -> str:
    """Graphviz DOT; a loop or map is a cluster holding its own node and its body."""
    lines = [f"digraph {_dot_id(plan.name)} {{", "  rankdir=TB;", "  node [shape=box];"]
    _dot_graph(plan, plan.graph.steps, lines, "  ")
    for spec in plan.specs.values():
        for source, target, label in _edges(plan, spec):
            attrs = f" [label={_dot_id(label)}]" if label else ""
            lines.append(f"  {_dot_id(source)} -> {_dot_id(target)}{attrs};")
        for child in _nested(plan, spec) or ():
            if not plan.specs[child].depends_on:
                lines.append(f"  {_dot_id(spec.id)} -> {_dot_id(child)} [style=dashed];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_graph(plan: Plan, steps: tuple[str, ...], lines: list[str], indent: str) -> None:
    for step_id in steps:
        spec = plan.specs[step_id]
        shape = ", shape=diamond" if spec.type == "switch" else ""
        label = _dot_id(f"{spec.id} ({spec.type})")
        node = f"{_dot_id(spec.id)} [label={label}{shape}];"
        nested = _nested(plan, spec)
        if nested is None:
            lines.append(indent + node)
            continue
        lines.append(f"{indent}subgraph {_dot_id('cluster_' + spec.id)} {{")
        lines.append(f"{indent}  label={label};")
        lines.append(f"{indent}  {node}")
        _dot_graph(plan, nested, lines, indent + "  ")
        lines.append(f"{indent}}}")


def _dot_id(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _nested(plan: Plan, spec: StepSpec) -> tuple[str, ...] | None:
    if spec.loop is not None:
        return spec.loop.body.steps
    if spec.map is not None:
        return (spec.map.template,)
    return None


def _edges(plan: Plan, spec: StepSpec) -> Iterator[tuple[str, str, str | None]]:
    """Edges into ``spec``: switch edges carry the case expression (or `default`)."""
    for dep in spec.depends_on:
        switch = plan.specs[dep].switch
        if switch is None or spec.id not in switch.targets:
            yield dep, spec.id, None
            continue
        for case in switch.cases:
            if spec.id in case.next:
                yield dep, spec.id, case.when.source
        if spec.id in (switch.default or ()):
            yield dep, spec.id, "default"
