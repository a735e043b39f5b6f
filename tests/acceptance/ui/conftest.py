"""The web UI in a real headless Chromium: Debian's ``chromium`` package, driven by
Playwright through ``executable_path`` (Playwright never downloads a browser here).

Each test serves the UI from a real process (`tideflow ui`, or `tideflow server
--embedded --http`) on a free loopback port over a SQLite store in the test's temporary
directory. Screenshots go to ``$TIDEFLOW_ARTIFACTS/ui`` (default ``tests/.artifacts/ui``,
git-ignored). Without chromium the tests skip, saying how to install it; under
``TIDEFLOW_REQUIRE_SERVICES`` (CI) a missing chromium fails them.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = os.environ.get("TIDEFLOW_CHROMIUM", "/usr/bin/chromium")
INSTALL = "apt-get install -y chromium (Debian's package; `make install` does it when root)"
STARTUP = 60.0
"""Seconds a UI process gets to print its address."""
EXPECT_TIMEOUT = 30_000
"""Milliseconds any one wait in the browser gets (Playwright's own bound)."""


def _required() -> bool:
    return os.environ.get("TIDEFLOW_REQUIRE_SERVICES", "").strip() not in ("", "0")


@pytest.fixture(scope="session")
def chromium() -> str:
    missing = None
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        missing = f"no chromium at {CHROMIUM}: {INSTALL}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "playwright is not installed: make install (it is in the dev extra)"
    if missing:
        if _required():
            pytest.fail(f"{missing} (TIDEFLOW_REQUIRE_SERVICES is set)")
        pytest.skip(missing)
    return CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))


@pytest.fixture(scope="session")
def artifacts() -> Path:
    base = Path(os.environ.get("TIDEFLOW_ARTIFACTS") or ROOT / "tests" / ".artifacts")
    out = base / "ui"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def browser(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT)
    with sync_playwright() as p:
        # --no-sandbox: the tests run as root in CI, where Chromium's sandbox cannot start;
        # --disable-dev-shm-usage: a container's /dev/shm is often too small for it
        launched = p.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Served:
    """A UI process: its base URL, and the lines it printed (stdout and stderr)."""

    proc: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    log: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    def line_with(self, text: str, timeout: float = STARTUP) -> str:
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line with {text!r}:\n" + "".join(self.log)) from None
            if text in line:
                return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.pump is not None:
            self.pump.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def tideflow(*args: str) -> list[str]:
    return [sys.executable, "-m", "tideflow.cli.main", *args]


def serve(*args: str) -> Served:
    """Start ``tideflow ARGS`` from the repository root (so ``examples`` imports)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        tideflow(*args),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    served = Served(proc)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            served.log.append(line)
            served.lines.put(line)

    served.pump = threading.Thread(target=pump, daemon=True, name="ui-output")
    served.pump.start()
    return served


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    """`tideflow ui` on a fresh SQLite store: the process and its one-time link."""
    store = f"sqlite:///{tmp_path / 'ui.db'}"
    served = serve("ui", "--store", store, "--http", "127.0.0.1:0", "--workers", "8")
    try:
        line = served.line_with("tideflow ui: open ")
        yield served, line.split("open ", 1)[1].strip()
    finally:
        served.stop()


def opened_as_admin(browser: Any, link: str) -> tuple[Any, str, list[str]]:
    """A page of the `tideflow ui` behind ``link`` (its one-time login link), signed in as
    the local admin: ``(page, the server's base URL, the page's JavaScript errors)``."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(link)
    expect(page.locator("#me")).to_contain_text("admin")
    return page, link.split("/ui/", 1)[0], errors
