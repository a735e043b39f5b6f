"""The plan drawing: every edge points down, no two nodes overlap, a layer is ordered
by its neighbours, and a map's template hangs below the map."""

from __future__ import annotations

from pathlib import Path

from tideflow.dsl.compiler import compile_definition, load_plan
from tideflow.model.plan import Plan
from tideflow.ui.layout import NODE_HEIGHT, NODE_WIDTH, layout

ROOT = Path(__file__).resolve().parents[3]


def plan_of(definition: dict[str, object]) -> Plan:
    return compile_definition(definition)


def test_the_moderation_example_is_drawn_in_layers_with_edges_pointing_down() -> None:
    plan = load_plan(ROOT / "examples" / "content_moderation.yaml")
    drawn = layout(plan)
    at = {n.id: n for n in drawn.nodes}
    assert set(at) == set(plan.specs)
    assert {at[s].layer for s in ("toxicity", "spam", "images")} == {0}
    assert [at[s].layer for s in ("combine", "route", "review", "verdict")] == [1, 2, 3, 4]
    assert at["publish"].layer == at["reject"].layer == 5 and at["record"].layer == 6
    for edge in drawn.edges:
        assert at[edge.source].layer < at[edge.target].layer, edge
    boxes = {(n.layer, round(n.x)) for n in drawn.nodes}
    assert len(boxes) == len(drawn.nodes)  # no two nodes on one spot
    for node in drawn.nodes:
        assert node.x >= 0 and node.x + NODE_WIDTH <= drawn.width
        assert node.y >= 0 and node.y + NODE_HEIGHT <= drawn.height
    for edge in drawn.edges:  # from the source's bottom to the target's top, round the rest
        (x0, y0), *bends, (x1, y1) = edge.points
        assert (x0, y0) == (at[edge.source].x + NODE_WIDTH / 2, at[edge.source].y + NODE_HEIGHT)
        assert (x1, y1) == (at[edge.target].x + NODE_WIDTH / 2, at[edge.target].y)
        assert len(bends) == at[edge.target].layer - at[edge.source].layer - 1
        for x, y in bends:
            assert not any(
                n.x <= x <= n.x + NODE_WIDTH and n.y <= y <= n.y + NODE_HEIGHT for n in drawn.nodes
            ), (edge, x, y)
    labels = {(e.source, e.target): e.label for e in drawn.edges}
    assert labels[("route", "publish")] == "default"
    assert labels[("route", "review")] == "steps.combine.output.score >= 0.4"
    assert labels[("combine", "route")] is None


def test_a_layer_is_ordered_by_the_mean_position_of_its_parents() -> None:
    plan = plan_of(
        {
            "name": "cross",
            "version": "1",
            "steps": [
                {"id": "a", "type": "noop"},
                {"id": "b", "type": "noop"},
                {"id": "under_b", "type": "noop", "depends_on": ["b"]},
                {"id": "under_a", "type": "noop", "depends_on": ["a"]},
            ],
        }
    )
    at = {n.id: n for n in layout(plan).nodes}
    assert at["a"].x < at["b"].x
    assert at["under_a"].x < at["under_b"].x  # declared the other way round: uncrossed


def test_a_map_template_hangs_below_its_map_on_a_nested_edge() -> None:
    plan = plan_of(
        {
            "name": "fan",
            "version": "1",
            "steps": [
                {
                    "id": "each",
                    "type": "map",
                    "items": "{{ [1, 2] }}",
                    "step": {"id": "one", "type": "noop"},
                },
                {"id": "after", "type": "noop", "depends_on": ["each"]},
            ],
        }
    )
    drawn = layout(plan)
    at = {n.id: n for n in drawn.nodes}
    assert at["one"].parent == "each" and at["each"].parent is None
    assert at["one"].layer == at["after"].layer == 1
    nested = [(e.source, e.target) for e in drawn.edges if e.nested]
    assert nested == [("each", "one")]
