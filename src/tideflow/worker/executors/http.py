"""The ``http`` executor: one HTTP call per attempt, on a pooled ``httpx.AsyncClient``.

The response is streamed and never held beyond ``max_response_bytes``. Every
request carries ``Idempotency-Key: <ctx.idempotency_key>``, which is the same for
every attempt of a step instance, so a server can deduplicate retries.
"""

from __future__ import annotations

import asyncio
import codecs
import email.utils
import logging
import math
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from tideflow.errors import StepTimeout
from tideflow.model import storable
from tideflow.model.action_schemas import HTTP_CONFIG_SCHEMA
from tideflow.worker.executors.base import OUTGOING_HEADERS, Executor, StepContext
from tideflow.worker.executors.config import check_config, seconds
from tideflow.worker.executors.errors import (
    HttpClientError,
    HttpError,
    HttpRateLimited,
    HttpResponseTooLarge,
    HttpServerError,
    HttpUnexpectedStatus,
    InvalidStepConfig,
    NetworkError,
)

if TYPE_CHECKING:
    import httpx  # imported where used: `tideflow runs list` needs no HTTP client

DEFAULT_MAX_RESPONSE_BYTES = 10 * 1024 * 1024
DEFAULT_TIMEOUT = 300.0
ERROR_BODY_READ_BYTES = 4096
USER_AGENT = "tideflow"

# httpx logs every request URL at INFO (and httpcore headers at DEBUG); a step's URL and
# headers may hold resolved secrets, so those records are dropped for our own calls.
_CHATTY_LOGGERS = ("httpx", "httpcore.http11", "httpcore.connection")
_quiet = ContextVar("tideflow_http_quiet", default=False)


@dataclass(frozen=True, slots=True)
class _Options:
    expect: frozenset[int] | None
    timeout: float
    max_bytes: int
    follow_redirects: bool


class HttpExecutor(Executor):
    """Runs ``http`` steps. One connection pool per executor instance."""

    name: ClassVar[str] = "http"
    config_schema: ClassVar[Mapping[str, Any]] = HTTP_CONFIG_SCHEMA

    def __init__(
        self,
        *,
        client: httpx.AsyncClient | None = None,
        default_timeout: float = DEFAULT_TIMEOUT,
        limits: httpx.Limits | None = None,
    ) -> None:
        self._client = client
        self._owns_client = client is None
        self._default_timeout = default_timeout
        self._limits = limits  # None: 100 connections, 20 kept alive (made with the client)
        _install_quiet_filter()

    async def execute(self, ctx: StepContext, config: Mapping[str, Any], input: Any) -> Any:
        import httpx

        cfg = check_config(self.name, self.config_schema, config)
        options = self._options(cfg, ctx)
        request = self._build_request(cfg, ctx, options)
        label = f"{request.method} {request.url}"
        try:
            async with asyncio.timeout(options.timeout):
                return await self._send(request, options)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise StepTimeout(f"{label}: no complete response within {options.timeout:g}s") from exc
        except httpx.UnsupportedProtocol as exc:
            raise InvalidStepConfig(f"{label}: {exc}") from exc
        except httpx.TooManyRedirects as exc:
            raise NetworkError(f"{label}: {exc}", retryable=False) from exc
        except httpx.RequestError as exc:
            raise NetworkError(f"{label}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc

    async def aclose(self) -> None:
        if self._client is not None and self._owns_client:
            await self._client.aclose()
            self._client = None

    @property
    def client(self) -> httpx.AsyncClient:
        """The pooled client, created on first use."""
        if self._client is None:
            import httpx

            limits = self._limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
            self._client = httpx.AsyncClient(
                limits=limits,
                headers={"user-agent": USER_AGENT},
                # Responses of one step must not leak cookies into another run's requests.
                cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
            )
        return self._client

    def _options(self, cfg: Mapping[str, Any], ctx: StepContext) -> _Options:
        expect = cfg.get("expect_status")
        if isinstance(expect, int):
            expect = [expect]
        timeout = seconds(cfg.get("timeout")) or ctx.timeout or self._default_timeout
        return _Options(
            expect=None if expect is None else frozenset(expect),
            timeout=timeout,
            max_bytes=int(cfg.get("max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES)),
            follow_redirects=bool(cfg.get("follow_redirects", True)),
        )

    def _build_request(
        self, cfg: Mapping[str, Any], ctx: StepContext, options: _Options
    ) -> httpx.Request:
        import httpx

        body = cfg.get("body")
        method = str(cfg.get("method") or ("GET" if body is None else "POST")).upper()
        headers = httpx.Headers()
        content = _encode_body(body, headers)
        for key, value in (cfg.get("headers") or {}).items():
            headers[key] = _header_value(value)
        headers.setdefault("idempotency-key", ctx.idempotency_key)
        for key, value in OUTGOING_HEADERS.get().items():  # trace context, when tracing is on
            headers.setdefault(key, value)
        try:
            return self.client.build_request(
                method,
                _url(cfg["url"], cfg.get("query")),
                headers=headers,
                content=content,
                timeout=httpx.Timeout(options.timeout),
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise InvalidStepConfig(f"invalid url {cfg['url']!r}: {exc}") from exc

    async def _send(self, request: httpx.Request, options: _Options) -> dict[str, Any]:
        with _no_library_logs():
            response = await self.client.send(
                request, stream=True, follow_redirects=options.follow_redirects
            )
            try:
                error = _status_error(response.status_code, options.expect)
                if error is not None:
                    raise await _http_error(error, request, response)
                raw = await _read_limited(request, response, options.max_bytes)
            finally:
                await response.aclose()
        return {
            "status": response.status_code,
            "headers": {key.lower(): value for key, value in response.headers.items()},
            **decode_body(response.headers.get("content-type", ""), raw),
        }


class _QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _quiet.get()


_QUIET_FILTER = _QuietFilter()


def _install_quiet_filter() -> None:
    for name in _CHATTY_LOGGERS:
        logger = logging.getLogger(name)
        if _QUIET_FILTER not in logger.filters:
            logger.addFilter(_QUIET_FILTER)


@contextmanager
def _no_library_logs() -> Iterator[None]:
    """Drop httpx/httpcore log records emitted in this context (they may show secrets)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


def _encode_body(body: Any, headers: httpx.Headers) -> bytes | None:
    if body is None:
        return None
    if isinstance(body, str):
        headers["content-type"] = "text/plain; charset=utf-8"
        return body.encode()
    headers["content-type"] = "application/json"
    try:
        return orjson.dumps(body)
    except TypeError as exc:
        raise InvalidStepConfig(f"http body cannot be encoded as JSON: {exc}") from exc


def _url(url: str, query: Mapping[str, Any] | None) -> httpx.URL:
    """``url`` with ``query`` merged into its query string (``query`` wins per key)."""
    import httpx

    params = {k: v for k, v in (query or {}).items() if v is not None}
    # Not build_request(params=…): httpx would replace the URL's own query string.
    return httpx.URL(url).copy_merge_params(params) if params else httpx.URL(url)


def _header_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _status_error(status: int, expect: frozenset[int] | None) -> type[HttpError] | None:
    """The error class for ``status``, or None when it counts as success."""
    if expect is not None and status in expect:
        return None
    if status == 429:
        return HttpRateLimited
    if status >= 500:
        return HttpServerError
    if status >= 400:
        return HttpClientError
    if expect is None and 200 <= status < 300:
        return None
    return HttpUnexpectedStatus


async def _http_error(
    cls: type[HttpError], request: httpx.Request, response: httpx.Response
) -> HttpError:
    text = await _read_snippet(response)
    method, url, status = request.method, str(request.url), response.status_code
    if cls is HttpRateLimited:
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        return HttpRateLimited(method=method, url=url, body=text, retry_after=retry_after)
    reason = None
    if cls is HttpUnexpectedStatus:
        reason = "not an expected status"
    return cls(method=method, url=url, status=status, body=text, reason=reason)


async def _read_snippet(response: httpx.Response) -> str:
    import httpx

    buffer = bytearray()
    try:
        async with _body_chunks(response) as chunks:
            async for chunk in chunks:
                buffer += chunk
                if len(buffer) >= ERROR_BODY_READ_BYTES:
                    break
    except httpx.HTTPError:
        pass  # the status is the error; a broken error body must not hide it
    return _decode_text(bytes(buffer[:ERROR_BODY_READ_BYTES]), _charset(response))


async def _read_limited(request: httpx.Request, response: httpx.Response, limit: int) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(request, f"Content-Length {declared}", limit)
    buffer = bytearray()
    async with _body_chunks(response) as chunks:
        async for chunk in chunks:
            buffer += chunk
            if len(buffer) > limit:
                raise _too_large(request, f"more than {limit} bytes", limit)
    return bytes(buffer)


@asynccontextmanager
async def _body_chunks(response: httpx.Response) -> AsyncIterator[AsyncIterator[bytes]]:
    """The decoded body chunks; the iterator is closed even when reading stops early."""
    chunks = response.aiter_bytes()
    try:
        yield chunks
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def _too_large(request: httpx.Request, what: str, limit: int) -> HttpResponseTooLarge:
    return HttpResponseTooLarge(
        f"{request.method} {request.url}: response body is {what}, "
        f"over max_response_bytes={limit}; raise the limit or fetch less"
    )


def decode_body(content_type: str, raw: bytes) -> dict[str, Any]:
    """``{"body": …}``: parsed JSON for JSON media types, else text.

    A JSON media type with a malformed body keeps the text as ``body`` and adds
    ``body_parse_error`` rather than failing the step; so does a body holding an integer
    a run cannot hold (model/storable.py: the rule of every edge), which a JSON parser
    bound to 64 bits would silently turn into a float.
    """
    media_type, _, params = content_type.partition(";")
    charset = _charset_param(params)
    if not _is_json(media_type.strip().lower()):
        return {"body": _decode_text(raw, charset)}
    if not raw.strip():
        return {"body": None}
    try:
        body = storable.loads(raw)
    except orjson.JSONDecodeError as exc:
        return {"body": _decode_text(raw, charset), "body_parse_error": str(exc)}
    found = storable.integer_problem(body)
    if found is not None:
        where = storable.format_path(found[0], "body")
        return {"body": _decode_text(raw, charset), "body_parse_error": f"{where}: {found[1]}"}
    return {"body": body}


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or HTTP-date)."""
    if not value or not value.strip():
        return None
    try:
        delay = float(value.strip())
    except ValueError:
        return _retry_after_date(value, time.time() if now is None else now)
    return max(0.0, delay) if math.isfinite(delay) else None


def _retry_after_date(value: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def _is_json(media_type: str) -> bool:
    return media_type in ("application/json", "text/json") or media_type.endswith("+json")


def _charset(response: httpx.Response) -> str:
    return _valid_charset(response.charset_encoding)


def _charset_param(params: str) -> str:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            return _valid_charset(value.strip().strip('"'))
    return "utf-8"


def _valid_charset(name: str | None) -> str:
    if not name:
        return "utf-8"
    try:
        codecs.lookup(name)
    except LookupError:
        return "utf-8"
    return name


def _decode_text(raw: bytes, charset: str) -> str:
    return raw.decode(charset, errors="replace")
