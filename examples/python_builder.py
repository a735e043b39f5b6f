"""A workflow written in Python with the builder instead of YAML.

Run it (from the repository root)::

    tideflow run examples/python_builder.py --input '{"name": "Ada", "words": ["tide", "flow"]}'
    tideflow graph examples/python_builder.py

`tideflow run`, `validate` and `graph` import this file and take its module-level
``workflow`` (``file.py:name`` picks another global). Each ``@workflow.task``
parameter is bound to input by name: ``name`` and ``words`` to the run input (the
input schema declares them), ``greet`` and ``count`` to the outputs of those
steps, which also makes ``report`` depend on them. An explicit ``input=`` wins.
"""

from __future__ import annotations

from tideflow import Workflow

workflow = Workflow(
    "python-builder",
    "1.0.0",
    description="Greet someone and count their words, built with the Python API.",
    input={
        "type": "object",
        "required": ["name", "words"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "words": {"type": "array", "items": {"type": "string"}},
        },
    },
    output="{{ steps.report.output }}",
)


@workflow.task()
def greet(name: str) -> dict[str, str]:
    return {"greeting": f"Hello, {name}!"}


@workflow.task(retry=2)
def count(words: list[str]) -> dict[str, int]:
    return {"words": len(words), "letters": sum(len(word) for word in words)}


@workflow.task(input={"punctuation": "."})
def report(greet: dict[str, str], count: dict[str, int], punctuation: str) -> dict[str, str]:
    text = f"{greet['greeting']} You gave {count['words']} words"
    return {"text": f"{text}, {count['letters']} letters{punctuation}"}


workflow.set("shout", {"loud": "{{ upper(steps.report.output.text) }}"}, depends_on=["report"])
