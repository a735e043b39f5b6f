import textwrap

import pytest

from tideflow.dsl import compile_definition, to_dot, to_mermaid
from tideflow.model.plan import Plan

FLOW = textwrap.dedent(
    """\
    name: shop
    version: "1"
    steps:
      - {id: reserve, type: python, function: "shop:reserve"}
      - id: route
        type: switch
        depends_on: [reserve]
        cases:
          - {when: 'inputs.kind == "big"', next: [approve]}
        default: [charge]
      - {id: approve, type: wait, signal: ok}
      - {id: charge, type: noop}
      - {id: pack, type: map, depends_on: [approve, charge], items: [1, 2], step: {type: noop}}
      - id: poll
        type: loop
        depends_on: [pack]
        max_iterations: 3
        until: steps.check.output
        steps:
          - {id: check, type: noop}
          - {id: log, type: noop, depends_on: [check]}
      - {id: end, type: noop, depends_on: [poll]}
    """
)


@pytest.fixture(scope="module")
def plan() -> Plan:
    return compile_definition(FLOW)


def test_mermaid_flowchart(plan: Plan) -> None:
    text = to_mermaid(plan)
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    assert '  reserve["reserve (python)"]' in lines
    assert '  route{"route (switch)"}' in lines
    assert "  reserve --> route" in lines
    assert '  route -->|"inputs.kind == #quot;big#quot;"| approve' in lines
    assert '  route -->|"default"| charge' in lines
    assert "  approve --> pack" in lines
    assert "  charge --> pack" in lines
    assert "    check --> log" not in lines  # edges are listed at the top level
    assert "  check --> log" in lines
    assert '  subgraph poll["poll (loop)"]' in lines
    assert '    check["check (noop)"]' in lines
    assert '  subgraph pack["pack (map)"]' in lines
    assert '    pack_item["pack_item (noop)"]' in lines
    assert "  poll --> step_end" in lines  # Mermaid keywords are renamed
    assert lines.count("  end") == 2


def test_dot_digraph(plan: Plan) -> None:
    text = to_dot(plan)
    assert text.startswith('digraph "shop" {')
    assert '"reserve" -> "route";' in text
    assert '"route" -> "approve" [label="inputs.kind == \\"big\\""];' in text
    assert '"route" -> "charge" [label="default"];' in text
    assert 'subgraph "cluster_poll" {' in text
    assert '"poll" -> "check" [style=dashed];' in text
    assert '"pack" -> "pack_item" [style=dashed];' in text
    assert '"check" -> "log";' in text
    assert '"route" [label="route (switch)", shape=diamond];' in text
    assert text.rstrip().endswith("}")


def test_every_dependency_is_an_edge(plan: Plan) -> None:
    mermaid = to_mermaid(plan)
    dot = to_dot(plan)
    for spec in plan.specs.values():
        for dep in spec.depends_on:
            assert f'"{dep}" -> "{spec.id}"' in dot
            target = "step_end" if spec.id == "end" else spec.id
            assert f" {dep} -" in mermaid
            assert f" {target}" in mermaid
