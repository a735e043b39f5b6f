"""The root help printed without typer (cli/root_help.py, from cli/root.py's table) is
typer's own, byte for byte: at several widths, with colour forced on, off, and forced on
under NO_COLOR, for ``tideflow --help`` and ``tideflow`` alone; the environment variables
typer reads once, when imported, are compared in fresh processes, on a pipe and on a
terminal; where typer would not print it (TYPER_USE_RICH, a completion request, a bad
TERMINAL_WIDTH) typer answers."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from collections.abc import Callable

import pytest
import typer.rich_utils
from typer.testing import CliRunner

from tideflow.cli import root_help
from tideflow.cli.main import app
from tideflow.cli.root import COMMANDS, OPTIONS, Flag

# what typer reads when imported, and rich when a console is made: each case sets its own
ENVIRON = (
    "COLUMNS",
    "LINES",
    "FORCE_COLOR",
    "NO_COLOR",
    "PY_COLORS",
    "GITHUB_ACTIONS",
    "TERMINAL_WIDTH",
    "_TYPER_FORCE_DISABLE_TERMINAL",
    "TYPER_USE_RICH",
    "_TIDEFLOW_COMPLETE",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "JUPYTER_COLUMNS",
    "JUPYTER_LINES",
)
COLOURS = {
    "plain": {},
    "forced": {"FORCE_COLOR": "1"},
    "forced, NO_COLOR": {"FORCE_COLOR": "1", "NO_COLOR": "1"},
}
ARGVS = {"--help": ["--help"], "no arguments": []}


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENVIRON:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    # what typer.rich_utils read when imported, as it reads them with the variables unset
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", None)
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", None)
    return monkeypatch


def _typers(argv: list[str]) -> tuple[int, bytes]:
    done = CliRunner().invoke(app, argv, prog_name="tideflow")
    assert done.stderr_bytes == b""
    return done.exit_code, done.stdout_bytes


def _light(argv: list[str], capsys: pytest.CaptureFixture[bytes]) -> tuple[int, bytes]:
    capsys.readouterr()
    status = root_help.answer(argv, os.environ)
    assert status is not None
    captured = capsys.readouterr()
    assert captured.err == b""
    return status, captured.out


@pytest.mark.parametrize("argv", ARGVS.values(), ids=ARGVS.keys())
@pytest.mark.parametrize("colour", COLOURS.values(), ids=COLOURS.keys())
@pytest.mark.parametrize("width", [40, 80, 120, 200])
def test_the_light_help_is_typers(
    width: int,
    colour: dict[str, str],
    argv: list[str],
    clean_environ: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    clean_environ.setenv("COLUMNS", str(width))
    for name, value in colour.items():
        clean_environ.setenv(name, value)
    light = _light(argv, capsysbinary)
    assert light == _typers(argv)
    assert light[0] == (0 if argv else 2)
    text = light[1].decode()
    assert ("\033[" in text) == ("FORCE_COLOR" in colour)
    assert ("\033[1;36m" in text) == (colour == COLOURS["forced"])  # bold cyan
    assert max(len(line) for line in text.splitlines() if "\033" not in line) <= width


def _perturbed_style(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(root_help, "STYLE_COMMANDS_TABLE_FIRST_COLUMN", "bold green")


def _perturbed_command(monkeypatch: pytest.MonkeyPatch) -> None:
    target, help = COMMANDS["runs"]
    monkeypatch.setattr(
        root_help, "COMMANDS", {**COMMANDS, "runs": (target, help.replace("a store", "the store"))}
    )


def _perturbed_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(root_help, "COMMANDS", dict(reversed(COMMANDS.items())))


def _perturbed_option(monkeypatch: pytest.MonkeyPatch) -> None:
    first, *others = OPTIONS
    changed = Flag(first.long, first.short, first.help.rstrip("."))
    monkeypatch.setattr(root_help, "OPTIONS", (changed, *others))


def _perturbed_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(root_help, "STYLE_TYPES", "bold blue")


PERTURBATIONS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "a style": _perturbed_style,
    "a command's help": _perturbed_command,
    "the commands' order": _perturbed_order,
    "an option's help": _perturbed_option,
    "the theme": _perturbed_type,
}


@pytest.mark.parametrize("perturb", PERTURBATIONS.values(), ids=PERTURBATIONS.keys())
def test_the_comparison_sees_a_difference(
    perturb: Callable[[pytest.MonkeyPatch], None],
    clean_environ: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """The comparison above can fail: the light help with one entry or style changed is
    not typer's."""
    clean_environ.setenv("COLUMNS", "120")
    clean_environ.setenv("FORCE_COLOR", "1")
    perturb(clean_environ)
    assert _light(["--help"], capsysbinary) != _typers(["--help"])


def test_the_styles_and_highlighters_are_typers() -> None:
    """What the comparisons above may not show (a style no text of the root uses yet)."""
    styles = [name for name in vars(root_help) if name.startswith("STYLE_")]
    ours = {name: getattr(root_help, name) for name in styles if name != "STYLE_PANEL_BORDER"}
    assert ours == {name: getattr(typer.rich_utils, name) for name in ours}
    panels = {
        typer.rich_utils.STYLE_OPTIONS_PANEL_BORDER,
        typer.rich_utils.STYLE_COMMANDS_PANEL_BORDER,
    }
    assert panels == {root_help.STYLE_PANEL_BORDER}
    for name in ("OptionHighlighter", "NegativeOptionHighlighter", "TypesHighlighter"):
        assert getattr(root_help, name).highlights == getattr(typer.rich_utils, name).highlights


def test_other_arguments_are_typers() -> None:
    for argv in (["--help", "runs"], ["runs", "--help"], ["-h"], ["--help", "--help"]):
        assert root_help.answer(argv, os.environ) is None


LIGHT = (
    "import sys\nsys.argv = ['tideflow', *sys.argv[1:]]\nfrom tideflow.cli.main import main\nmain()"
)
TYPER = "from tideflow.cli.app import app\napp(prog_name='tideflow')"


def _environ(**extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ENVIRON}
    environ["TERM"] = "xterm-256color"
    return {**environ, **extra}


def _run(code: str, argv: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", code, *argv], env=environ, capture_output=True, timeout=60
    )


PROCESSES = {
    # what typer reads once, when imported
    "TERMINAL_WIDTH": {"TERMINAL_WIDTH": "60"},
    "PY_COLORS": {"PY_COLORS": "1"},
    "GITHUB_ACTIONS": {"GITHUB_ACTIONS": "true", "COLUMNS": "100"},
    "_TYPER_FORCE_DISABLE_TERMINAL": {"FORCE_COLOR": "1", "_TYPER_FORCE_DISABLE_TERMINAL": "1"},
    # what the interpreter reads when it starts: an ASCII stdout (boxes drawn in ASCII)
    "PYTHONIOENCODING=ascii": {"PYTHONIOENCODING": "ascii", "FORCE_COLOR": "1"},
    "TERM=dumb": {"TERM": "dumb", "FORCE_COLOR": "1"},
}


@pytest.mark.parametrize("extra", PROCESSES.values(), ids=PROCESSES.keys())
def test_the_variables_read_when_a_process_starts(extra: dict[str, str]) -> None:
    environ = _environ(**extra)
    light = _run(LIGHT, ["--help"], environ)
    typers = _run(TYPER, ["--help"], environ)
    assert (light.returncode, light.stdout, light.stderr) == (0, typers.stdout, b"")
    assert typers.returncode == 0 and b"Commands" in light.stdout


FALLBACKS = {  # typer answers: what it prints is not the rich help
    "TYPER_USE_RICH": ({"TYPER_USE_RICH": "0"}, ["--help"]),
    "a completion request": ({"_TIDEFLOW_COMPLETE": "complete_bash"}, []),
}


@pytest.mark.parametrize(("extra", "argv"), FALLBACKS.values(), ids=FALLBACKS.keys())
def test_typer_answers_what_the_light_help_does_not_print(
    extra: dict[str, str], argv: list[str]
) -> None:
    environ = _environ(COLUMNS="100", **extra)
    light = _run(LIGHT, argv, environ)
    typers = _run(TYPER, argv, environ)
    assert (light.returncode, light.stdout, light.stderr) == (
        typers.returncode,
        typers.stdout,
        typers.stderr,
    )
    assert light.stdout + light.stderr and "╭" not in light.stdout.decode()
    assert root_help.console(environ) is None


def test_a_terminal_width_that_is_no_number_is_typers_error() -> None:
    environ = _environ(TERMINAL_WIDTH="wide")
    light = _run(LIGHT, ["--help"], environ)
    typers = _run(TYPER, ["--help"], environ)
    assert light.returncode == typers.returncode == 1
    last = b"ValueError: invalid literal for int() with base 10: 'wide'"
    assert light.stderr.splitlines()[-1] == typers.stderr.splitlines()[-1] == last


def _on_a_terminal(code: str, columns: int) -> bytes:
    """What ``code`` writes on a terminal ``columns`` wide (TERM=xterm-256color)."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--help"],
        env=_environ(),
        stdin=child,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    written = b""
    try:
        while select.select([parent], [], [], 60)[0]:
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # EIO: the child's side is closed
                break
            if not chunk:
                break
            written += chunk
    finally:
        os.close(parent)
        assert process.wait(timeout=60) == 0
    return written


def test_on_a_terminal_the_light_help_is_typers() -> None:
    """Width and colour found from the terminal itself."""
    light = _on_a_terminal(LIGHT, 97)
    assert light == _on_a_terminal(TYPER, 97)
    assert b"\033[1;36m" in light
    assert max(len(line) for line in light.decode().splitlines() if "\033" not in line) <= 97


@pytest.mark.parametrize("argv", ARGVS.values(), ids=ARGVS.keys())
def test_no_stdout_is_typers_answer(argv: list[str]) -> None:
    """Started with stdout closed (``sys.stdout`` None): nothing printed, as typer."""
    light = _run("import sys\nsys.stdout = None\n" + LIGHT, argv, _environ())
    typers = _run("import sys\nsys.stdout = None\n" + TYPER, argv, _environ())
    assert (light.returncode, light.stderr) == (typers.returncode, typers.stderr)
    assert light.stderr == b"" and light.returncode == (0 if argv else 2)


def test_a_closed_pipe_is_typers_answer() -> None:
    """Help written to a pipe nobody reads: exit 1 and nothing on stderr, as typer."""
    answers = []
    for code in (LIGHT, TYPER):
        reader, writer = os.pipe()
        os.close(reader)
        try:
            done = subprocess.run(
                [sys.executable, "-c", code, "--help"],
                env=_environ(),
                stdout=writer,
                stderr=subprocess.PIPE,
                timeout=60,
            )
        finally:
            os.close(writer)
        answers.append((done.returncode, done.stderr))
    assert answers[0] == answers[1] == (1, b"")
