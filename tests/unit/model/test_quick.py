"""`quick_init`: the events' and commands' quicker ``__init__`` does what the dataclass's did."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest

from tideflow.model import commands, events
from tideflow.model.quick import quick_init
from tideflow.runtime.result import RunResult, StepResult
from tideflow.worker.executors.base import StepContext
from tideflow.worker.interceptors import ExecuteInput, ExecuteOutput


def _dataclasses(*modules: Any) -> list[type]:
    return [
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type)
        and dataclasses.is_dataclass(value)
        and value.__module__ == module.__name__
    ]


CLASSES = [
    *_dataclasses(events, commands),
    RunResult,
    StepResult,
    StepContext,
    ExecuteInput,
    ExecuteOutput,
]


def test_every_value_built_per_step_is_built_quickly() -> None:
    assert len(CLASSES) > 20
    assert [c.__name__ for c in CLASSES if "_set0" not in c.__init__.__code__.co_names] == []


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_signature_is_the_fields(cls: type) -> None:
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    for param, field in zip(params, fields, strict=True):
        if field.default is not dataclasses.MISSING:
            assert param.default is field.default
        elif field.default_factory is dataclasses.MISSING:
            assert param.default is inspect.Parameter.empty


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_set_and_defaults_apply(cls: type) -> None:
    fields = dataclasses.fields(cls)
    given = {f.name: object() for f in fields}
    full = cls(**given)
    assert all(getattr(full, name) is value for name, value in given.items())
    required = {
        f.name: given[f.name]
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    least, other = cls(**required), cls(**required)
    for field in fields:
        if field.default is not dataclasses.MISSING:
            assert getattr(least, field.name) is field.default
        elif field.default_factory is not dataclasses.MISSING:
            assert getattr(least, field.name) == field.default_factory()
            made = getattr(least, field.name)
            assert made is not getattr(other, field.name) or not isinstance(made, list | dict)
    assert least == other


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_still_frozen_and_strict(cls: type) -> None:
    fields = dataclasses.fields(cls)
    values = {f.name: f"v{i}" for i, f in enumerate(fields)}
    instance = cls(**values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(instance, fields[0].name, "changed")
    with pytest.raises(TypeError):
        cls(*values.values())  # keyword-only, as before
    with pytest.raises(TypeError):
        cls(**values, no_such_field=1)
    required = [f.name for f in fields if f.default is dataclasses.MISSING]
    if required:
        with pytest.raises(TypeError):
            cls(**{k: v for k, v in values.items() if k != required[0]})
    assert dataclasses.replace(instance, **{fields[0].name: "new"}) != instance
    assert pickle.loads(pickle.dumps(instance)) == instance
    assert hash(instance) == hash(cls(**values))


def test_a_default_factory_makes_a_new_value_each_time() -> None:
    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Box:
        name: str
        items: list[int] = dataclasses.field(default_factory=list)

    one, two = Box(name="a"), Box(name="b")
    assert one.items == [] and one.items is not two.items
    given = [1]
    assert Box(name="c", items=given).items is given


@pytest.mark.parametrize(
    "decorator",
    [
        dataclasses.dataclass(slots=True, kw_only=True),  # not frozen
        dataclasses.dataclass(frozen=True, kw_only=True),  # not slotted
        dataclasses.dataclass(frozen=True, slots=True),  # positional fields
    ],
)
def test_other_shapes_are_refused(decorator: Any) -> None:
    cls = decorator(type("Shape", (), {"__annotations__": {"name": "str"}}))
    with pytest.raises(TypeError, match="quick_init"):
        quick_init(cls)


def test_a_post_init_is_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Checked:
        name: str

        def __post_init__(self) -> None:
            pass

    with pytest.raises(TypeError, match="__post_init__"):
        quick_init(Checked)
