"""The drawing of a plan for the web UI: nodes placed in layers, computed from the Plan.

A layered drawing (Sugiyama-style, the two cheap phases): each step's layer is the
length of the longest dependency path to it, so every edge points down; within a layer
the steps are ordered by the barycentre (mean position) of their neighbours, swept down
and up a few times to untangle the edges. A loop body or a map template hangs below its
owner (a dashed edge from the owner to the body's roots). An edge that crosses layers
gets a bend in each (a "virtual node", ordered with the steps), so it goes round the
steps in between instead of through them. Linear in the steps and edges
for each sweep; no crossing minimisation beyond that (a plan is drawn, not typeset).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from tideflow.model.plan import Plan, StepSpec

__all__ = ["Edge", "Layout", "Node", "layout"]

NODE_WIDTH = 168
NODE_HEIGHT = 44
GAP_X = 36
GAP_Y = 56
MARGIN = 20
SWEEPS = 4
BEND_WIDTH = 16
BEND = "\x00bend:"
"""The id prefix of an edge's bend (no step id holds a NUL)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    id: str
    type: str
    layer: int
    x: float
    y: float
    parent: str | None
    """The loop or map this step belongs to (None at the top level)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Edge:
    source: str
    target: str
    label: str | None
    nested: bool
    """From a loop or map to its body (drawn dashed)."""
    points: tuple[tuple[float, float], ...] = ()
    """Where it goes: the source's bottom, a bend in each layer it crosses, the target's
    top."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    nodes: list[Node]
    edges: list[Edge]
    width: float
    height: float


def layout(plan: Plan) -> Layout:
    """Every step of ``plan`` placed (top to bottom), with the edges between them."""
    edges = list(_edges(plan))
    incoming: dict[str, list[str]] = {s: [] for s in plan.specs}
    outgoing: dict[str, list[str]] = {s: [] for s in plan.specs}
    for edge in edges:
        incoming[edge.target].append(edge.source)
        outgoing[edge.source].append(edge.target)
    layers = _layers(list(plan.specs), incoming, outgoing)
    chains = _split_long_edges(edges, layers, incoming, outgoing)
    rows = _order(layers, incoming, outgoing)
    centre, width = _place(rows)
    parents = _parents(plan)
    nodes = [
        Node(
            id=step_id,
            type=plan.specs[step_id].type,
            layer=layers[step_id],
            x=centre[step_id] - NODE_WIDTH / 2,
            y=_top(layers[step_id]),
            parent=parents.get(step_id),
        )
        for row in rows
        for step_id in row
        if step_id in plan.specs
    ]
    routed = [
        replace(edge, points=_route(edge, chains.get(index, []), layers, centre))
        for index, edge in enumerate(edges)
    ]
    height = 2 * MARGIN + len(rows) * NODE_HEIGHT + max(len(rows) - 1, 0) * GAP_Y
    return Layout(nodes=nodes, edges=routed, width=width, height=height)


def _split_long_edges(
    edges: list[Edge],
    layers: dict[str, int],
    incoming: dict[str, list[str]],
    outgoing: dict[str, list[str]],
) -> dict[int, list[str]]:
    """An edge across several layers becomes a chain of bends, one per layer between
    (placed and ordered like steps), so that it goes round the steps on its way."""
    chains: dict[int, list[str]] = {}
    for index, edge in enumerate(edges):
        span = layers[edge.target] - layers[edge.source]
        if span <= 1:
            continue
        bends = [f"{BEND}{index}.{k}" for k in range(1, span)]
        for k, bend in enumerate(bends, start=1):
            layers[bend] = layers[edge.source] + k
        outgoing[edge.source].remove(edge.target)
        incoming[edge.target].remove(edge.source)
        chain = [edge.source, *bends, edge.target]
        for upper, lower in itertools.pairwise(chain):
            outgoing.setdefault(upper, []).append(lower)
            incoming.setdefault(lower, []).append(upper)
        chains[index] = bends
    return chains


def _place(rows: list[list[str]]) -> tuple[dict[str, float], float]:
    """The horizontal centre of every step and bend (each row centred), and the width."""

    def size(item: str) -> float:
        return BEND_WIDTH if item.startswith(BEND) else NODE_WIDTH

    spans = [sum(size(i) for i in row) + max(len(row) - 1, 0) * GAP_X for row in rows]
    widest = max(spans, default=0.0)
    centre: dict[str, float] = {}
    for row, span in zip(rows, spans, strict=True):
        at = MARGIN + (widest - span) / 2
        for item in row:
            centre[item] = at + size(item) / 2
            at += size(item) + GAP_X
    return centre, 2 * MARGIN + widest


def _top(layer: int) -> float:
    return MARGIN + layer * (NODE_HEIGHT + GAP_Y)


def _route(
    edge: Edge, bends: list[str], layers: dict[str, int], centre: dict[str, float]
) -> tuple[tuple[float, float], ...]:
    """From the bottom of the source, through its bends, to the top of the target."""
    start = (centre[edge.source], _top(layers[edge.source]) + NODE_HEIGHT)
    middle = [(centre[b], _top(layers[b]) + NODE_HEIGHT / 2) for b in bends]
    return (start, *middle, (centre[edge.target], _top(layers[edge.target])))


def _edges(plan: Plan) -> Iterator[Edge]:
    for spec in plan.specs.values():
        for dep in spec.depends_on:
            if dep in plan.specs:
                yield Edge(source=dep, target=spec.id, label=_label(plan, dep, spec), nested=False)
        for child in _body(spec):
            if not plan.specs[child].depends_on:
                yield Edge(source=spec.id, target=child, label=None, nested=True)


def _label(plan: Plan, source: str, spec: StepSpec) -> str | None:
    switch = plan.specs[source].switch
    if switch is None or spec.id not in switch.targets:
        return None
    labels = [case.when.source for case in switch.cases if spec.id in case.next]
    if spec.id in (switch.default or ()):
        labels.append("default")
    return " | ".join(labels) or None


def _body(spec: StepSpec) -> tuple[str, ...]:
    if spec.loop is not None:
        return spec.loop.body.steps
    if spec.map is not None:
        return (spec.map.template,)
    return ()


def _parents(plan: Plan) -> dict[str, str]:
    return {child: spec.id for spec in plan.specs.values() for child in _body(spec)}


def _layers(
    steps: list[str], incoming: dict[str, list[str]], outgoing: dict[str, list[str]]
) -> dict[str, int]:
    """Longest path from a root (Kahn's order); a step on a cycle (none in a compiled
    plan) goes below everything."""
    waiting = {s: len(incoming[s]) for s in steps}
    ready = [s for s in steps if waiting[s] == 0]
    layer = dict.fromkeys(steps, 0)
    seen: list[str] = []
    while ready:
        step = ready.pop()
        seen.append(step)
        for later in outgoing[step]:
            layer[later] = max(layer[later], layer[step] + 1)
            waiting[later] -= 1
            if waiting[later] == 0:
                ready.append(later)
    bottom = max(layer.values(), default=0) + 1
    for step in steps:
        if waiting[step] > 0:
            layer[step] = bottom
    return layer


def _order(
    layers: dict[str, int], incoming: dict[str, list[str]], outgoing: dict[str, list[str]]
) -> list[list[str]]:
    """The steps of each layer, in barycentre order (declaration order to start with)."""
    rows: list[list[str]] = [[] for _ in range(max(layers.values(), default=-1) + 1)]
    for step, depth in layers.items():
        rows[depth].append(step)
    for sweep in range(SWEEPS):
        downward = sweep % 2 == 0
        indices = range(1, len(rows)) if downward else range(len(rows) - 2, -1, -1)
        for depth in indices:
            near = rows[depth - 1] if downward else rows[depth + 1]
            position = {s: i for i, s in enumerate(near)}
            links = incoming if downward else outgoing
            rows[depth] = _by_barycentre(rows[depth], links, position)
    return rows


def _by_barycentre(
    row: list[str], links: dict[str, list[str]], position: dict[str, int]
) -> list[str]:
    def centre(item: tuple[int, str]) -> float:
        index, step = item
        placed = [position[n] for n in links[step] if n in position]
        return sum(placed) / len(placed) if placed else float(index)

    return [step for _, step in sorted(enumerate(row), key=centre)]
