from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest

from tideflow.dsl.compiler import compile_definition
from tideflow.testing.harness import CoreHarness


def plan_of(yaml_text: str):  # type: ignore[no-untyped-def]
    return compile_definition(textwrap.dedent(yaml_text))


@pytest.fixture
def harness() -> Callable[..., CoreHarness]:
    def make(
        yaml_text: str, input: object = None, start: bool = True, auto_start: bool = True
    ) -> CoreHarness:
        h = CoreHarness(plan_of(yaml_text), auto_start=auto_start)
        if start:
            h.start(input)
        return h

    return make
