"""`tideflow.loop`: the event loop the commands run on, chosen by ``TIDEFLOW_LOOP``; a
`tideflow` command on each loop, and a wrong value refused with what to write."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop

import tideflow.loop
from tideflow.errors import TideflowError

FLOW = 'name: loops\nversion: "1"\nsteps:\n  - {id: a, type: noop}\n  - {id: b, type: noop, depends_on: [a]}\n'


@pytest.mark.parametrize(
    ("value", "name"),
    [(None, "uvloop"), ("", "uvloop"), ("auto", "uvloop"), ("uvloop", "uvloop"),
     (" UVLoop ", "uvloop"), ("asyncio", "asyncio"), ("AsyncIO", "asyncio")],
)  # fmt: skip
def test_the_variable_chooses_the_loop(value: str | None, name: str) -> None:
    environ = {} if value is None else {tideflow.loop.ENV: value}
    assert tideflow.loop.loop_name(environ) == name


def test_a_wrong_value_names_the_choices() -> None:
    with pytest.raises(TideflowError, match="TIDEFLOW_LOOP='libev' names no event loop: use"):
        tideflow.loop.loop_name({"TIDEFLOW_LOOP": "libev"})


def test_without_uvloop_auto_falls_back_and_uvloop_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert tideflow.loop.loop_name({}) == "asyncio"
    assert tideflow.loop.loop_factory({}) is asyncio.new_event_loop
    with pytest.raises(TideflowError, match=r"uvloop is not installed here.*pip install uvloop"):
        tideflow.loop.loop_name({"TIDEFLOW_LOOP": "uvloop"})


@pytest.mark.parametrize(
    ("value", "kind"), [("uvloop", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)]
)
def test_run_runs_the_coroutine_on_the_chosen_loop(
    monkeypatch: pytest.MonkeyPatch, value: str, kind: type
) -> None:
    monkeypatch.setenv(tideflow.loop.ENV, value)

    async def main() -> object:
        await asyncio.sleep(0)
        return asyncio.get_running_loop()

    loop = tideflow.loop.run(main())
    assert isinstance(loop, kind)
    assert loop.is_closed()  # the loop's life cycle is asyncio.run's


def test_run_with_a_wrong_value_leaves_no_coroutine_unawaited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(tideflow.loop.ENV, "nope")

    async def main() -> None:
        raise AssertionError("must not run")

    coro = main()
    with pytest.raises(TideflowError):
        tideflow.loop.run(coro)
    assert coro.cr_frame is None  # closed: no "never awaited" warning


def _tideflow(cwd: Path, *args: str, loop: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tideflow.cli.main", *args],
        cwd=cwd,
        env={**os.environ, "TIDEFLOW_LOOP": loop, "PYTHONWARNINGS": "error::RuntimeWarning"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_command_runs_a_workflow_on_either_loop(tmp_path: Path, loop: str) -> None:
    (tmp_path / "flow.yaml").write_text(FLOW)
    done = _tideflow(tmp_path, "run", "flow.yaml", "--json", loop=loop)
    assert done.returncode == 0, done.stderr
    assert '"succeeded"' in done.stdout


def test_a_command_refuses_a_wrong_loop_before_it_does_anything(tmp_path: Path) -> None:
    (tmp_path / "flow.yaml").write_text(FLOW)
    done = _tideflow(tmp_path, "run", "flow.yaml", loop="tokio")
    assert done.returncode == 2
    assert "TIDEFLOW_LOOP='tokio' names no event loop: use uvloop, asyncio or auto" in done.stderr
    assert "never awaited" not in done.stderr
    assert not (tmp_path / ".tideflow").exists()  # no store was opened
