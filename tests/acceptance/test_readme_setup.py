"""The README's two set-up commands, on a fresh clone, in either order.

The first command (`pip install -e .` into `.venv`, then `tideflow run`) creates
`.venv/bin/tideflow` without the dev tools; `make install` (what `make test` runs
first) must still install them, and the first command must still work on the dev
install afterwards. One clone of the committed HEAD goes through run, make, run
(installing from the configured package index takes tens of seconds; `make install`
on a clone with no `.venv` is what `.ci/run` itself does on its fresh clone).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 600

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * INSTALL_TIMEOUT)]


def _readme_commands() -> list[str]:
    """The README's first two ```bash blocks, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [block.split("#")[0].strip() for block in blocks[:2]]


FIRST, SECOND = _readme_commands()


def _env() -> dict[str, str]:
    """The caller's environment without this worktree's virtual environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "TIDEFLOW_STORE")}
    ours = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != ours)
    return env


def _sh(cwd: Path, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    target = tmp_path / "tideflow"
    done = subprocess.run(
        ["git", "clone", "-q", str(ROOT), str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return target


def _dev_tools_installed(clone: Path) -> None:
    for tool in ("ruff", "mypy", "pytest", "tideflow"):
        assert (clone / ".venv" / "bin" / tool).exists(), tool
    # Up to date now: the next `make test` goes straight to the checks.
    assert _sh(clone, "make -q install").returncode == 0


def test_the_readme_names_the_commands_this_test_runs() -> None:
    assert FIRST.startswith("python3 -m venv .venv && ")
    assert FIRST.endswith(".venv/bin/tideflow run examples/etl.yaml")
    assert SECOND == "make test"


def test_run_first_then_make_then_run_again(clone: Path) -> None:
    """Both orders on one clone (one install, not two): the run command on a fresh
    clone, then `make install` adds the dev tools, then the run command again on the
    dev install, as someone who ran `make test` first and then the README's example
    would, leaves it working and up to date."""
    first = _sh(clone, FIRST)
    assert first.returncode == 0, first.stderr
    assert not (clone / ".venv" / "bin" / "ruff").exists()

    install = _sh(clone, "make install")  # the start of `make test`

    assert install.returncode == 0, install.stderr
    _dev_tools_installed(clone)

    again = _sh(clone, FIRST)

    assert again.returncode == 0, again.stderr
    _dev_tools_installed(clone)
