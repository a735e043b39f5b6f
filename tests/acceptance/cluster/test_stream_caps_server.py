"""`tideflow server --max-streams-per-token N --max-streams M`: a real server process caps
its open event streams as its flags say (429 with ``Retry-After`` past them), and refuses
a cap under 1, or one without ``--http``, with exit 2."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import TIDEFLOW, Proc  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TIDEFLOW_")}


def opened(streams: contextlib.ExitStack, api: httpx.Client) -> httpx.Response:
    """A stream of the runs held open once its first event came, or the refusal."""
    response = streams.enter_context(api.stream("GET", "/streams/runs"))
    if response.status_code == 200:
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        streams.callback(lines.close)
    else:
        response.read()
    return response


@pytest.mark.slow
def test_the_servers_flags_cap_its_event_streams(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [TIDEFLOW, "server", "--embedded", "--http", "127.0.0.1:0", "--no-auth",
             "--max-streams-per-token", "2", "--max-streams", "5"],
            env=environment(), stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
    server = Proc("server", popen, log)
    try:
        server.wait_log("HTTP API listening on")
        found = re.search(r"HTTP API listening on (http://127\.0\.0\.1:\d+)", server.text())
        assert found, server.text()
        with (
            httpx.Client(base_url=found.group(1), timeout=10) as api,
            contextlib.ExitStack() as streams,
        ):
            assert [opened(streams, api).status_code for _ in range(2)] == [200, 200]
            refused = opened(streams, api)
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "5"
            assert "(max_streams_per_token 2, " in refused.json()["detail"]
            assert api.get("/health").status_code == 200
    finally:
        assert server.term() == 0, server.text()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--http", "127.0.0.1:0", "--max-streams", "0"], "--max-streams"),
        (["--http", "127.0.0.1:0", "--max-streams-per-token", "0"], "--max-streams-per-token"),
        (["--max-streams", "10"], "--max-streams is about the HTTP API"),
        (["--max-streams-per-token", "10"], "--max-streams-per-token is about the HTTP API"),
    ],
)
def test_a_stream_cap_under_one_or_without_http_exits_2(
    tmp_path: Path, args: list[str], says: str
) -> None:
    done = subprocess.run(
        [TIDEFLOW, "server", "--embedded", *args],
        env=environment(), cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
