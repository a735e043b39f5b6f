"""A workflow's `title:`: any language, one line, NFC, part of the plan; the name stays an
ASCII id and a name that is not one is told how to write it."""

import unicodedata

import pytest

from tideflow.dsl import Workflow, compile_definition, validate
from tideflow.dsl.schema_values import TITLE_MAX, ascii_name
from tideflow.errors import Diagnostic

STEPS = "steps: [{id: a, type: noop}]\n"


def definition(name: str, title: str | None = None) -> str:
    line = "" if title is None else f"title: {title}\n"
    return f'name: {name}\n{line}version: "1"\n{STEPS}'


def errors(text: str) -> list[Diagnostic]:
    return [d for d in validate(text, file="flow.yaml") if d.severity == "error"]


@pytest.mark.parametrize(
    "title",
    ["订单履约流程", "Auftragsabwicklung für Bestellungen", "معالجة الطلبات", "Заказы 🚚 2024"],
)
def test_a_title_in_any_language_is_kept_in_the_plan(title: str) -> None:
    plan = compile_definition(
        {"name": "orders", "title": title, "version": "1", "steps": [{"id": "a", "type": "noop"}]}
    )
    assert (plan.name, plan.title, plan.source["title"]) == ("orders", title, title)


def test_a_title_is_nfc_so_one_title_typed_two_ways_is_one_plan() -> None:
    composed = "Überweisung prüfen"
    decomposed = unicodedata.normalize("NFD", composed)
    assert decomposed != composed
    plans = [
        compile_definition({"name": "pay", "title": t, "version": "1", "steps": [{"id": "a", "type": "noop"}]})
        for t in (composed, decomposed)
    ]  # fmt: skip
    assert [p.title for p in plans] == [composed, composed]
    assert plans[0].hash == plans[1].hash


def test_without_a_title_the_plan_and_its_hash_are_as_before() -> None:
    plan = compile_definition(
        {"name": "pay", "version": "1", "steps": [{"id": "a", "type": "noop"}]}
    )
    assert plan.title is None
    assert "title" not in plan.source


def test_the_builder_takes_a_title() -> None:
    flow = Workflow("orders", "1", title="订单履约流程")
    flow.noop("a")
    assert flow.compile().title == "订单履约流程"


@pytest.mark.parametrize(
    ("title", "message"),
    [
        ('""', "title is empty"),
        ('"   "', "title is empty"),
        ('"one\\ntwo"', "title holds the control character U+000A"),
        ('"tab\\there"', "title holds the control character U+0009"),
        ('"evil\\u202egnp.exe"', "title holds the control character U+202E"),
        ('"x\\u2066y"', "title holds the control character U+2066"),
        (f'"{"长" * (TITLE_MAX + 1)}"', f"title is {TITLE_MAX + 1} characters long"),
        ("[a, b]", "title must be a string, got a list"),
    ],
)
def test_a_title_that_is_not_one_line_of_text_is_refused(title: str, message: str) -> None:
    (error,) = errors(definition("orders", title))
    assert error.message.startswith(message), error.message
    assert (error.path, error.line, error.hint is not None) == ("title", 2, True)


def test_a_name_in_another_script_is_told_to_use_a_title() -> None:
    (error,) = errors(definition("订单履约流程"))
    assert error.message == "invalid name '订单履约流程': must match [a-z0-9][a-z0-9_.-]*"
    assert error.hint is not None
    assert "`title: 订单履约流程`" in error.hint
    assert "e.g." not in error.hint and "'0" not in error.hint  # no '0______'


@pytest.mark.parametrize(
    ("name", "ascii"),
    [
        ("Order Flow", "order_flow"),
        ("Café Überweisung", "cafe_uberweisung"),
        ("Zahlung (neu) v2.1", "zahlung_neu_v2.1"),
        ("订单 flow", "flow"),
    ],
)
def test_a_name_that_has_an_ascii_form_is_told_it_and_the_title(name: str, ascii: str) -> None:
    (error,) = errors(definition(f'"{name}"'))
    assert error.hint is not None
    assert f"e.g. '{ascii}'" in error.hint
    assert f"`title: {name}`" in error.hint
    assert errors(definition(ascii, f'"{name}"')) == []  # and what it says is valid


def test_the_title_a_hint_suggests_is_valid_yaml_as_written() -> None:
    (error,) = errors(definition('"Orders: #1 (neu)"'))
    assert error.hint is not None
    assert "e.g. 'orders_1_neu'" in error.hint
    assert '`title: "Orders: #1 (neu)"`' in error.hint
    assert errors(definition("orders_1_neu", '"Orders: #1 (neu)"')) == []


@pytest.mark.parametrize("text", ["订单履约流程", "---", "...", "_", "🚚"])
def test_no_ascii_form_is_made_up(text: str) -> None:
    assert ascii_name(text) is None


def test_a_subflow_is_told_to_name_a_workflow_not_to_add_a_title() -> None:
    text = 'name: parent\nversion: "1"\nsteps: [{id: s, type: subflow, workflow: 订单履约流程}]\n'
    (error,) = errors(text)
    assert error.hint is not None
    assert "title" not in error.hint
