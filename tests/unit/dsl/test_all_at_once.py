"""`validate` reports every problem of a definition in one pass: structural errors no
longer hide the graph and expression errors of the same file."""

import textwrap

from tideflow.dsl import validate

FLOW = textwrap.dedent(
    """\
    name: flow
    version: "1"
    steps:
      - id: route
        type: switch
        cases: [{when: "{{ inputs.x > 1 }}", next: [a]}]
      - id: a
        type: noop
        depends_on: [b]
      - id: b
        type: noop
        depends_on: [a]
      - id: a
        type: wait
        signal: go
        timeuot: 5s
      - id: c
        type: noop
        depends_on: [nope]
        when: "{{ inputs.x > }}"
      - 42
      - id: d
        type: pyhton
        depends_on: [c]
        input: {v: "{{ steps.zzz.output }}"}
    """
)


def test_every_kind_of_problem_is_reported_at_once_each_at_its_position() -> None:
    found = [(d.line, d.column, d.step_id, d.message) for d in validate(FLOW, file="f.yaml")]
    assert sorted(found, key=lambda f: (f[0] or 0, f[1] or 0)) == [
        (4, 5, "route", "missing required key 'default' in a switch step"),
        (9, 18, "a", "dependency cycle: a -> b -> a"),
        (13, 9, "a", "duplicate step id 'a' (defined on lines 7 and 13)"),
        (16, 5, "a", "unknown key 'timeuot' in a wait step"),
        (19, 18, "c", "depends_on names unknown step 'nope'"),
        (20, 25, "c", "invalid syntax in expression `inputs.x >`"),
        (21, 5, None, "a step must be a mapping, got an integer (42)"),
        (23, 11, "d", "unknown step type 'pyhton'"),
        (25, 16, "d", "step 'd' reads steps.zzz, but there is no step 'zzz'"),
    ]


def test_a_structurally_broken_nested_step_keeps_its_loop_checked() -> None:
    text = textwrap.dedent(
        """\
        name: flow
        version: "1"
        steps:
          - id: poll
            type: loop
            until: "{{ steps.check.output.done }}"
            steps:
              - {id: check, type: noop, depends_on: [later]}
              - {id: later, type: noop, depends_on: [check]}
              - {id: bad, type: sleep}
        """
    )
    messages = sorted(d.message for d in validate(text))
    assert messages == [
        "a sleep step needs exactly one of `duration` or `until`",
        "dependency cycle: check -> later -> check",
        "missing required key 'max_iterations' in a loop step",
    ]


def test_a_duplicate_key_does_not_hide_the_rest() -> None:
    text = textwrap.dedent(
        """\
        name: flow
        version: "1"
        steps:
          - {id: a, type: noop, depends_on: [b], type: noop}
          - {id: b, type: noop, depends_on: [a]}
        """
    )
    assert sorted(d.message for d in validate(text)) == [
        "dependency cycle: a -> b -> a",
        "duplicate key 'type' (first defined on line 4)",
    ]
