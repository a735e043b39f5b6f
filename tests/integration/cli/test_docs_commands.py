"""The docs name every command the CLI has, and do not call an existing one unbuilt."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tideflow.cli.main import app

from .conftest import command_paths

ROOT = Path(__file__).resolve().parents[3]


def _commands() -> list[str]:
    return [" ".join(words) for words in command_paths()]


def _section(path: str, heading: str) -> str:
    text = (ROOT / path).read_text(encoding="utf-8")
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def test_the_concepts_cli_table_lists_every_command() -> None:
    section = _section("docs/concepts.md", "## The CLI")
    missing = [c for c in _commands() if f"`tideflow {c}" not in section]
    assert missing == []
    assert "in-memory state" not in section  # `run` keeps state in --store


def _options() -> set[str]:
    """Every option some command takes (``--server``, ``--json`` …)."""
    import typer.main

    found: set[str] = set()
    click = typer.main.get_command(app)
    stack = [click]
    while stack:
        command = stack.pop()
        stack.extend(getattr(command, "commands", {}).values())
        for param in command.params:
            found.update(o for o in param.opts if o.startswith("--"))
    return found


NOT_BUILT = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if "\n## Not built yet" in
             p.read_text(encoding="utf-8")]  # fmt: skip


def test_the_not_built_yet_sections_are_found() -> None:
    assert "operations.md" in NOT_BUILT


@pytest.mark.parametrize("doc", NOT_BUILT)
def test_not_built_yet_names_no_command_or_option_that_exists(doc: str) -> None:
    section = _section(f"docs/{doc}", "## Not built yet")
    # Each bullet names what is missing; after "Today" it may say what exists instead.
    bullets = [
        re.split(r"\btoday\b", b, maxsplit=1, flags=re.I)[0] for b in section.split("\n- ")[1:]
    ]
    missing = " ".join(bullets)
    named = set(re.findall(r"`tideflow ([a-z]+(?: [a-z]+)?)", missing))
    existing = set(_commands()) | {c.split()[0] for c in _commands()}
    assert named & existing == set()
    options = set(re.findall(r"`[^`]*?(--[a-z][a-z-]*)", missing))
    assert options & _options() == set()


def test_the_operations_not_built_yet_bullets_are_read() -> None:
    section = _section("docs/operations.md", "## Not built yet")
    assert "Definitions are never pruned" in section  # the check reads the bullets


def test_the_changelog_lists_every_command() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    line = re.search(r"^- CLI: `validate`.*?(?=^- )", changelog, re.M | re.S)
    assert line is not None
    text = line.group(0)
    for command in _commands():
        first, _, sub = command.partition(" ")
        assert f"`{first}" in text, command
        listed = re.search(rf"`{first} [a-z|]*\b{sub}\b", text)
        assert not sub or listed or f"{command}`" in changelog, command
