"""The shell executor with real processes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import orjson
import pytest
from tests.processes import alive, eventually, spawns_return_late

from tideflow.errors import StepTimeout
from tideflow.worker.executors.errorinfo import error_info_from_exception
from tideflow.worker.executors.errors import (
    InvalidStepConfig,
    ShellCommandFailed,
    ShellCommandNotFound,
)
from tideflow.worker.executors.shell import DEFAULT_MAX_OUTPUT_BYTES, ShellExecutor

from .conftest import make_ctx


@pytest.fixture
def shell() -> ShellExecutor:
    return ShellExecutor()


def _same_file(a: str, b: Path) -> bool:
    return os.path.samefile(a, b)


async def test_success_output(shell: ShellExecutor) -> None:
    out = await shell.execute(make_ctx(), {"command": ["echo", "hello", "world"]}, None)
    assert out == {"exit_code": 0, "stdout": "hello world\n", "stderr": ""}


async def test_arguments_are_not_interpreted_by_a_shell(shell: ShellExecutor) -> None:
    out = await shell.execute(make_ctx(), {"command": ["echo", "$HOME", "*", 42]}, None)
    assert out["stdout"] == "$HOME * 42\n"


async def test_nonzero_exit_fails_with_the_stderr_tail(shell: ShellExecutor) -> None:
    script = "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); echo err-line-$i >&2; done; exit 3"
    with pytest.raises(ShellCommandFailed) as caught:
        await shell.execute(make_ctx(), {"command": ["sh", "-c", script]}, None)
    error = caught.value
    assert error.exit_code == 3
    assert error.retryable
    assert "exited with code 3" in error.message
    assert "err-line-3000" in error.message
    assert "err-line-1\n" not in error.message  # only the tail
    assert len(error.message) < 2300
    assert error_info_from_exception(error).type == "ShellCommandFailed"


async def test_killed_by_a_signal(shell: ShellExecutor) -> None:
    with pytest.raises(ShellCommandFailed) as caught:
        await shell.execute(make_ctx(), {"command": ["sh", "-c", "kill -9 $$"]}, None)
    assert caught.value.exit_code == -9
    assert "killed by signal SIGKILL" in caught.value.message


async def test_timeout_kills_grandchildren(shell: ShellExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"sleep 30 & echo $! > {pidfile}; wait"
    started = time.monotonic()
    with pytest.raises(StepTimeout) as caught:
        await shell.execute(make_ctx(timeout=0.5), {"command": ["sh", "-c", script]}, None)
    assert time.monotonic() - started < 5
    assert "process group was killed" in caught.value.message
    grandchild = int(pidfile.read_text())
    assert await eventually(lambda: not alive(grandchild))


async def test_timeout_escalates_to_sigkill(shell: ShellExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"trap '' TERM; sh -c 'trap \"\" TERM; sleep 30' & echo $! > {pidfile}; wait"
    config = {"command": ["sh", "-c", script], "timeout": 0.3, "kill_grace": 0.2}
    with pytest.raises(StepTimeout):
        await shell.execute(make_ctx(), config, None)
    grandchild = int(pidfile.read_text())
    assert await eventually(lambda: not alive(grandchild))


async def test_a_cancel_while_the_command_is_spawned_kills_what_it_started(
    shell: ShellExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command runs before the spawn returns (the loop still connects its pipes): a
    cancel then (a timeout, a cancelled run) left the command's children running with
    nobody to stop them (seen in CI: a grandchild alive after the cancel)."""
    pidfile = tmp_path / "pid"
    release = spawns_return_late(monkeypatch)
    script = f"sleep 30 & echo $! > {pidfile}; wait"
    task = asyncio.create_task(
        shell.execute(make_ctx(timeout=None), {"command": ["sh", "-c", script]}, None)
    )
    assert await eventually(lambda: pidfile.exists() and pidfile.read_text().strip())
    task.cancel()
    await asyncio.sleep(0.05)  # the cancel reaches the spawn before it returns
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    grandchild = int(pidfile.read_text())
    assert await eventually(lambda: not alive(grandchild))


async def test_cancellation_kills_the_process_group(shell: ShellExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"sleep 30 & echo $! > {pidfile}; wait"
    task = asyncio.create_task(
        shell.execute(make_ctx(timeout=None), {"command": ["sh", "-c", script]}, None)
    )
    assert await eventually(lambda: pidfile.exists() and pidfile.read_text().strip())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    grandchild = int(pidfile.read_text())
    assert await eventually(lambda: not alive(grandchild))


async def test_huge_output_is_capped_with_a_marker(shell: ShellExecutor) -> None:
    total = 50_000_000
    config = {"command": ["sh", "-c", f"yes | head -c {total}"]}
    out = await shell.execute(make_ctx(timeout=60), config, None)
    marker = f"\n…[truncated {total - DEFAULT_MAX_OUTPUT_BYTES} bytes]"
    assert out["stdout"].endswith(marker)
    assert len(out["stdout"]) == DEFAULT_MAX_OUTPUT_BYTES + len(marker)


async def test_custom_output_cap_applies_to_stderr(shell: ShellExecutor) -> None:
    config = {
        "command": ["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' e >&2"],
        "max_output_bytes": 100,
    }
    out = await shell.execute(make_ctx(), config, None)
    assert out["stderr"] == "e" * 100 + "\n…[truncated 4900 bytes]"


async def test_missing_binary_is_not_retryable(shell: ShellExecutor) -> None:
    with pytest.raises(ShellCommandNotFound) as caught:
        await shell.execute(make_ctx(), {"command": ["no-such-program-tf", "x"]}, None)
    assert not caught.value.retryable
    assert "no-such-program-tf" in caught.value.message
    assert "PATH=" in caught.value.message


async def test_missing_relative_program(shell: ShellExecutor, tmp_path: Path) -> None:
    with pytest.raises(ShellCommandNotFound) as caught:
        await shell.execute(make_ctx(), {"command": ["./nope"], "cwd": str(tmp_path)}, None)
    assert str(tmp_path / "nope") in caught.value.message


async def test_env_is_an_allow_list(shell: ShellExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEFLOW_SECRET_DB", "hunter22")
    monkeypatch.setenv("TF_TEST_ALLOWED", "yes")
    config = {"command": ["env"], "env": {"DECLARED": 5}, "env_allow": ["TF_TEST_ALLOWED"]}
    out = await shell.execute(make_ctx(), config, None)
    env = dict(line.split("=", 1) for line in out["stdout"].splitlines())
    assert "TIDEFLOW_SECRET_DB" not in env
    assert env["TF_TEST_ALLOWED"] == "yes"
    assert env["DECLARED"] == "5"
    assert env["PATH"] == os.environ["PATH"]
    assert set(env) <= {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TZ",
        "TMPDIR",
        "TF_TEST_ALLOWED",
        "DECLARED",
    }


async def test_string_command_is_refused(shell: ShellExecutor) -> None:
    with pytest.raises(InvalidStepConfig) as caught:
        await shell.execute(make_ctx(), {"command": "ls -l"}, None)
    assert "use a list" in caught.value.message
    assert not caught.value.retryable


async def test_cwd(shell: ShellExecutor, tmp_path: Path) -> None:
    out = await shell.execute(make_ctx(), {"command": ["pwd"], "cwd": str(tmp_path)}, None)
    assert _same_file(out["stdout"].strip(), tmp_path)


async def test_missing_cwd_is_a_config_error(shell: ShellExecutor, tmp_path: Path) -> None:
    with pytest.raises(InvalidStepConfig):
        await shell.execute(make_ctx(), {"command": ["pwd"], "cwd": str(tmp_path / "x")}, None)


async def test_stdin_json(shell: ShellExecutor) -> None:
    data = {"order": 7, "items": ["a", "b"]}
    out = await shell.execute(make_ctx(), {"command": ["cat"], "stdin": "json"}, data)
    assert orjson.loads(out["stdout"]) == data


async def test_no_stdin_by_default(shell: ShellExecutor) -> None:
    out = await shell.execute(make_ctx(), {"command": ["cat"]}, {"ignored": True})
    assert out["stdout"] == ""


async def test_invalid_utf8_is_replaced(shell: ShellExecutor) -> None:
    out = await shell.execute(make_ctx(), {"command": ["printf", "a\\377b"]}, None)
    assert out["stdout"] == "a\ufffdb"
