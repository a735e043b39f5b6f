"""The root help (``tideflow --help``, and ``tideflow`` alone) printed from the root's
table (cli/root.py) with rich alone: typer, click and the parts of rich typer's help
imports (Markdown, Syntax, traceback) cost three times what this does
(docs/operations.md, "A fast CLI").

What it prints is what typer prints, byte for byte, at any width, with or without
colour: the renderables below are those typer's ``rich_utils.rich_format_help`` builds
(typer 0.29) for what the root has (a usage line, a help text in rich markup, flags, the
commands in the default panel), printed on a console made as typer makes it, from the
same environment variables. Where typer would do something else (``TYPER_USE_RICH``
set, a shell-completion request, a ``TERMINAL_WIDTH`` that is not a number)
``console`` returns None and typer answers. tests/unit/cli/test_root_help.py compares
the two.
"""

from __future__ import annotations

import errno
import inspect
import sys
from collections.abc import Iterator, Mapping
from gettext import gettext as _
from typing import IO, Any, TextIO, cast

from rich.align import Align
from rich.columns import Columns
from rich.console import Console, Group
from rich.highlighter import RegexHighlighter
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.theme import Theme

from tideflow.cli.root import COMMANDS, HELP, OPTIONS, PROG, USAGE, Flag

# typer's rich_utils styles, for what the root help shows
STYLE_OPTION = "bold cyan"
STYLE_SWITCH = "bold green"
STYLE_NEGATIVE_OPTION = "bold magenta"
STYLE_NEGATIVE_SWITCH = "bold red"
STYLE_TYPES = "bold yellow"
STYLE_TYPES_SEPARATOR = "dim"
STYLE_USAGE = "yellow"
STYLE_USAGE_COMMAND = "bold"
STYLE_HELPTEXT_FIRST_LINE = ""
STYLE_HELPTEXT = "dim"
STYLE_OPTION_HELP = ""
STYLE_PANEL_BORDER = "dim"
STYLE_COMMANDS_TABLE_FIRST_COLUMN = "bold cyan"
FLAG_TYPE = "<bool>"
"""The type column of a flag (typer's ``display_type_rich`` of a bool)."""
ANSI_PREFIX = "\033["


class OptionHighlighter(RegexHighlighter):
    highlights = [
        r"(^|\W)(?P<switch>\-\w+)(?![a-zA-Z0-9])",
        r"(^|\W)(?P<option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
        r"(?P<types>\<[^\>]+\>)",
        r"(?P<usage>Usage: )",
    ]


class NegativeOptionHighlighter(RegexHighlighter):
    highlights = [
        r"(^|\W)(?P<negative_switch>\-\w+)(?![a-zA-Z0-9])",
        r"(^|\W)(?P<negative_option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
    ]


class TypesHighlighter(RegexHighlighter):
    highlights = [
        r"^(?P<types_sep>(\[|<))",
        r"(?P<types_sep>\|)",
        r"(?P<types_sep>(\]|>))(\.\.\.)?$",
    ]


highlighter = OptionHighlighter()
negative_highlighter = NegativeOptionHighlighter()
types_highlighter = TypesHighlighter()


def console(environ: Mapping[str, str]) -> Console | None:
    """A console made as typer's ``_get_rich_console`` makes it under ``environ``, or
    None when typer would not print the rich help this module prints."""
    if "TYPER_USE_RICH" in environ or f"_{PROG.upper()}_COMPLETE" in environ:
        return None
    width = environ.get("TERMINAL_WIDTH")
    try:
        max_width = int(width) if width else None
    except ValueError:
        return None  # typer fails on it, in its own words
    force_terminal = (
        True
        if environ.get("GITHUB_ACTIONS") or environ.get("FORCE_COLOR") or environ.get("PY_COLORS")
        else None
    )
    if environ.get("_TYPER_FORCE_DISABLE_TERMINAL"):
        force_terminal = False
    theme = {
        "option": STYLE_OPTION,
        "switch": STYLE_SWITCH,
        "negative_option": STYLE_NEGATIVE_OPTION,
        "negative_switch": STYLE_NEGATIVE_SWITCH,
        "types": STYLE_TYPES,
        "types_sep": STYLE_TYPES_SEPARATOR,
        "usage": STYLE_USAGE,
    }
    return Console(
        theme=Theme(theme),
        highlighter=highlighter,
        color_system="auto",
        force_terminal=force_terminal,
        width=max_width,
    )


def print_help(out: Console) -> None:
    """Print the root help as typer's ``rich_format_help`` does."""
    out.print(Padding(highlighter(f"Usage: {PROG} {USAGE}"), 1), style=STYLE_USAGE_COMMAND)
    if HELP:
        out.print(Padding(Align(Group(*_help_text(HELP)), pad=False), (0, 1, 1, 1)))
    out.print(_panel(_("Options"), _options_table()))
    out.print(_panel(_("Commands"), _commands_table()))


def _rich_text(text: str, style: str = "") -> Text:
    text = inspect.cleandoc(text)
    if ANSI_PREFIX in text:
        return highlighter(Text.from_ansi(text, style=style))
    return highlighter(Text.from_markup(text, style=style))


def _help_text(help: str) -> Iterator[Text]:
    first, *others = inspect.cleandoc(help).partition("\f")[0].split("\n\n")
    if not first.startswith("\b"):
        first = first.replace("\n", " ")
    yield _rich_text(first.strip(), STYLE_HELPTEXT_FIRST_LINE)
    if others:
        yield Text("")
        yield _rich_text("\n\n".join(others), STYLE_HELPTEXT)


def _panel(title: str, table: Table) -> Panel:
    return Panel(table, border_style=STYLE_PANEL_BORDER, title=title, title_align="left")


def _table(*, highlight: bool) -> Table:
    return Table(
        highlight=highlight,
        show_header=False,
        expand=True,
        box=None,
        show_lines=False,
        leading=0,
        border_style=None,
        row_styles=None,
        pad_edge=False,
        padding=(0, 1),
    )


def _options_table() -> Table:
    table = _table(highlight=True)
    for flag in OPTIONS:
        kind = Text(style=STYLE_TYPES, overflow="fold")
        kind.append(FLAG_TYPE)
        table.add_row(
            highlighter(flag.long),
            highlighter(flag.short),
            negative_highlighter(""),
            negative_highlighter(""),
            types_highlighter(kind),
            Columns([_rich_text(_option_help(flag), STYLE_OPTION_HELP)] if flag.help else []),
        )
    return table


def _option_help(flag: Flag) -> str:
    paragraphs = [
        p.replace("\n", " ").strip() if not p.startswith("\b") else "{}\n".format(p.strip("\b\n"))
        for p in flag.help.split("\n\n")
    ]
    return "\n".join(paragraphs).strip()


def _commands_table() -> Table:
    table = _table(highlight=False)
    table.add_column(
        style=STYLE_COMMANDS_TABLE_FIRST_COLUMN, no_wrap=True, width=max(map(len, COMMANDS))
    )
    table.add_column("Description", justify="left", no_wrap=False, ratio=10)
    for name, (_target, help) in COMMANDS.items():
        first = inspect.cleandoc(help).split("\n\n")[0]
        if first.startswith("\b"):
            first = first.replace("\b\n", "")
        table.add_row(Text(name), _rich_text(first.strip(), STYLE_OPTION_HELP))
    return table


def answer(argv: list[str], environ: Mapping[str, str]) -> int | None:
    """Print the root help if ``argv`` asks for it and this module can print it as typer
    would: the exit status then (0 for ``--help``, 2 for no arguments, as click's
    ``no_args_is_help``), else None."""
    if argv not in ([], ["--help"]):
        return None
    out = console(environ)
    if out is None:
        return None
    try:
        print_help(out)
        if argv and sys.stdout is not None:  # None: started with stdout closed
            # click echoes the help it got back from the rich printing: an empty line
            sys.stdout.write("\n")
            sys.stdout.flush()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        # as click: no "Exception ignored" when the interpreter flushes at exit
        sys.stdout = cast(TextIO, _Pacified(sys.stdout))
        sys.stderr = cast(TextIO, _Pacified(sys.stderr))
        return 1
    return 0 if argv else 2


class _Pacified:
    """A stream whose flush ignores a broken pipe (click's ``PacifyFlushWrapper``)."""

    def __init__(self, wrapped: IO[Any]) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)
