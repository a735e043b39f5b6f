"""The http executor against a real local HTTP server (no mocks of httpx)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from tideflow.errors import StepTimeout
from tideflow.worker.executors.errorinfo import error_info_from_exception
from tideflow.worker.executors.errors import (
    HttpClientError,
    HttpRateLimited,
    HttpResponseTooLarge,
    HttpServerError,
    HttpUnexpectedStatus,
    InvalidStepConfig,
    NetworkError,
)
from tideflow.worker.executors.http import DEFAULT_MAX_RESPONSE_BYTES, HttpExecutor

from .conftest import LocalServer, http_date, make_ctx

MiB = 1024 * 1024


@pytest.fixture
async def http(http_server: LocalServer) -> AsyncIterator[HttpExecutor]:
    executor = HttpExecutor()
    yield executor
    await executor.aclose()


async def test_get_json_response(http: HttpExecutor, http_server: LocalServer) -> None:
    out = await http.execute(make_ctx(), {"url": f"{http_server.url}/json"}, None)
    assert out["status"] == 200
    assert out["body"] == {"ok": True, "items": [1, 2]}
    assert out["headers"]["content-type"].startswith("application/json")
    assert "body_parse_error" not in out


async def test_post_json_body_with_query_and_headers(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    config = {
        "url": f"{http_server.url}/echo",
        "body": {"order": 7},
        "query": {"page": 2, "skip": None},
        "headers": {"X-Trace": "abc", "X-Flag": True},
    }
    out = await http.execute(make_ctx(), config, None)
    echo = out["body"]
    assert echo["method"] == "POST"
    assert echo["query"] == {"page": "2"}
    assert echo["headers"]["content-type"] == "application/json"
    assert echo["headers"]["x-trace"] == "abc"
    assert echo["headers"]["x-flag"] == "true"
    assert echo["body"] == '{"order":7}'


async def test_text_body_and_explicit_method(http: HttpExecutor, http_server: LocalServer) -> None:
    config = {"url": f"{http_server.url}/echo", "method": "put", "body": "plain words"}
    echo = (await http.execute(make_ctx(), config, None))["body"]
    assert echo["method"] == "PUT"
    assert echo["body"] == "plain words"
    assert echo["headers"]["content-type"].startswith("text/plain")


async def test_server_error_is_retryable(http: HttpExecutor, http_server: LocalServer) -> None:
    url = f"{http_server.url}/status/503?body=backend+down"
    with pytest.raises(HttpServerError) as caught:
        await http.execute(make_ctx(), {"url": url}, None)
    error = caught.value
    assert error.retryable
    assert error.status == 503
    assert "GET" in error.message and "/status/503" in error.message
    assert "backend down" in error.message
    assert error_info_from_exception(error).type == "HttpServerError"


async def test_error_body_snippet_is_bounded(http: HttpExecutor, http_server: LocalServer) -> None:
    url = f"{http_server.url}/status/500?body={'x' * 3000}"
    with pytest.raises(HttpServerError) as caught:
        await http.execute(make_ctx(), {"url": url}, None)
    error = caught.value
    assert len(error.body_snippet) == 501  # 500 characters and a marker
    assert error.message.endswith(error.body_snippet)
    assert len(error.message) <= len(f"GET {url} returned HTTP 500: ") + 501


async def test_rate_limited_with_retry_after_seconds(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    url = f"{http_server.url}/status/429?retry_after=7"
    with pytest.raises(HttpRateLimited) as caught:
        await http.execute(make_ctx(), {"url": url}, None)
    assert caught.value.retryable
    assert caught.value.retry_after == 7.0
    info = error_info_from_exception(caught.value)
    assert info.type == "HttpRateLimited"
    assert info.retry_after == 7.0


async def test_rate_limited_with_retry_after_http_date(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    url = f"{http_server.url}/status/429?retry_after={http_date(30)}"
    with pytest.raises(HttpRateLimited) as caught:
        await http.execute(make_ctx(), {"url": url}, None)
    assert caught.value.retry_after is not None
    assert 20 <= caught.value.retry_after <= 31


async def test_client_error_is_not_retryable(http: HttpExecutor, http_server: LocalServer) -> None:
    with pytest.raises(HttpClientError) as caught:
        await http.execute(make_ctx(), {"url": f"{http_server.url}/status/400"}, None)
    assert not caught.value.retryable
    assert caught.value.status == 400
    assert not error_info_from_exception(caught.value).retryable


async def test_idempotency_key_is_identical_across_attempts(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    config = {"url": f"{http_server.url}/flaky", "method": "POST", "body": {"n": 1}}
    with pytest.raises(HttpServerError):
        await http.execute(make_ctx(attempt=1, key="run-9:charge"), config, None)
    out = await http.execute(make_ctx(attempt=2, key="run-9:charge"), config, None)
    assert out["body"] == {"done": True}
    keys = [r["headers"]["idempotency-key"] for r in http_server.state.requests]
    assert keys == ["run-9:charge", "run-9:charge"]


async def test_explicit_idempotency_key_header_wins(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    config = {"url": f"{http_server.url}/echo", "headers": {"Idempotency-Key": "mine"}}
    echo = (await http.execute(make_ctx(), config, None))["body"]
    assert echo["headers"]["idempotency-key"] == "mine"


async def test_slow_server_times_out_within_the_timeout(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    started = time.monotonic()
    with pytest.raises(StepTimeout) as caught:
        await http.execute(make_ctx(), {"url": f"{http_server.url}/slow", "timeout": 0.5}, None)
    assert time.monotonic() - started < 3
    assert caught.value.type_name == "TimeoutError"
    assert "/slow" in caught.value.message


async def test_server_that_reads_but_never_answers(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    started = time.monotonic()
    with pytest.raises(StepTimeout):
        await http.execute(make_ctx(timeout=0.5), {"url": f"{http_server.url}/hang"}, None)
    assert time.monotonic() - started < 3


async def test_listener_that_never_accepts(http: HttpExecutor, silent_listener: str) -> None:
    started = time.monotonic()
    with pytest.raises(StepTimeout):
        await http.execute(make_ctx(timeout=0.5), {"url": silent_listener}, None)
    assert time.monotonic() - started < 3


async def test_drip_fed_body_is_bounded_by_the_total_timeout(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    # Each byte arrives well within a read timeout; only a whole-call deadline stops it.
    started = time.monotonic()
    with pytest.raises(StepTimeout):
        await http.execute(make_ctx(), {"url": f"{http_server.url}/drip", "timeout": 0.6}, None)
    assert time.monotonic() - started < 3


async def test_malformed_json_keeps_the_text(http: HttpExecutor, http_server: LocalServer) -> None:
    out = await http.execute(make_ctx(), {"url": f"{http_server.url}/malformed"}, None)
    assert out["status"] == 200
    assert out["body"] == '{"ok": tru'
    assert out["body_parse_error"]


@pytest.mark.parametrize("chunked", ["0", "1"])
async def test_ten_megabytes_over_a_one_megabyte_limit(
    http: HttpExecutor, http_server: LocalServer, chunked: str
) -> None:
    config = {
        "url": f"{http_server.url}/bytes/{10 * MiB}?chunked={chunked}",
        "max_response_bytes": MiB,
    }
    with pytest.raises(HttpResponseTooLarge) as caught:
        await http.execute(make_ctx(), config, None)
    assert not caught.value.retryable
    assert str(MiB) in caught.value.message


async def test_exactly_the_default_limit_is_accepted(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    url = f"{http_server.url}/bytes/{DEFAULT_MAX_RESPONSE_BYTES}?chunked=1"
    out = await http.execute(make_ctx(), {"url": url}, None)
    assert len(out["body"]) == DEFAULT_MAX_RESPONSE_BYTES == 10 * MiB


async def test_one_byte_over_the_default_limit_is_refused(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    url = f"{http_server.url}/bytes/{DEFAULT_MAX_RESPONSE_BYTES + 1}?chunked=1"
    with pytest.raises(HttpResponseTooLarge):
        await http.execute(make_ctx(), {"url": url}, None)


async def test_connection_refused_is_a_retryable_network_error(
    http: HttpExecutor, closed_port_url: str
) -> None:
    with pytest.raises(NetworkError) as caught:
        await http.execute(make_ctx(), {"url": closed_port_url}, None)
    assert caught.value.retryable
    assert closed_port_url.rstrip("/") in caught.value.message


async def test_expect_status_not_met(http: HttpExecutor, http_server: LocalServer) -> None:
    config = {"url": f"{http_server.url}/json", "expect_status": 201}
    with pytest.raises(HttpUnexpectedStatus) as caught:
        await http.execute(make_ctx(), config, None)
    assert not caught.value.retryable
    assert caught.value.status == 200


async def test_expect_status_accepts_an_error_status(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    config = {"url": f"{http_server.url}/status/404", "expect_status": [200, 404]}
    out = await http.execute(make_ctx(), config, None)
    assert out["status"] == 404
    assert out["body"] == "status 404 body"


async def test_unexpected_server_error_keeps_its_retryable_class(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    config = {"url": f"{http_server.url}/status/502", "expect_status": [201]}
    with pytest.raises(HttpServerError) as caught:
        await http.execute(make_ctx(), config, None)
    assert caught.value.retryable


async def test_cookies_do_not_leak_between_calls(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    await http.execute(make_ctx(), {"url": f"{http_server.url}/cookie"}, None)
    echo = (await http.execute(make_ctx(), {"url": f"{http_server.url}/echo"}, None))["body"]
    assert "cookie" not in echo["headers"]


async def test_calls_share_one_client(http: HttpExecutor, http_server: LocalServer) -> None:
    await http.execute(make_ctx(), {"url": f"{http_server.url}/json"}, None)
    client = http.client
    await http.execute(make_ctx(), {"url": f"{http_server.url}/json"}, None)
    assert http.client is client
    await http.aclose()
    assert client.is_closed


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({}, "'url' is a required property"),
        ({"url": "ftp://example.invalid/x"}, "ftp"),
        ({"url": "http://127.0.0.1:1/", "colour": "red"}, "colour"),
        ({"url": "http://127.0.0.1:1/", "expect_status": 42}, "expect_status"),
    ],
)
async def test_invalid_config_is_not_retryable(
    http: HttpExecutor, config: dict[str, object], fragment: str
) -> None:
    with pytest.raises(InvalidStepConfig) as caught:
        await http.execute(make_ctx(), config, None)
    assert fragment in caught.value.message
    assert not caught.value.retryable


async def test_query_merges_into_the_url_query(
    http: HttpExecutor, http_server: LocalServer
) -> None:
    config = {"url": f"{http_server.url}/echo?a=1&b=2", "query": {"b": "3", "c": [4, 5]}}
    echo = (await http.execute(make_ctx(), config, None))["body"]
    assert echo["query"] == {"a": "1", "b": "3", "c": "5"}


async def test_library_request_logs_are_dropped_for_step_calls_only(
    http: HttpExecutor, http_server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await http.execute(make_ctx(), {"url": f"{http_server.url}/echo?token=s3cr3t-value"}, None)
    assert "s3cr3t-value" not in caplog.text
    async with httpx.AsyncClient() as other:
        await other.get(f"{http_server.url}/json")
    assert any(r.name == "httpx" and "/json" in r.getMessage() for r in caplog.records)
