"""The API's one error shape: RFC 9457 problem details (``application/problem+json``).

Every error a client can see is a `Problem`: FastAPI's own (unknown route 404, wrong
method 405, a request of the wrong shape 422 naming each field, malformed JSON 400),
a body over the limit (413, `BodyLimit`), tideflow's errors (`ERRORS`: one row per
class of the tree in tideflow/errors.py, a test checks none is missing) and anything
else (500 with a generic detail; the exception is logged, never sent).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tideflow import errors
from tideflow.api.problem_types import ERRORS, TYPE_PREFIX
from tideflow.errors import DefinitionError, InputValidationError, TideflowError
from tideflow.model import storable

log = logging.getLogger("tideflow.api")

PROBLEM_JSON = "application/problem+json"


class FieldError(BaseModel):
    """One problem with one field of the request: ``field`` is its path (``body.input``,
    ``query.limit``, a definition's ``body.steps[0].type``, a run input's
    ``body.input.order_id``)."""

    field: str
    message: str
    line: int | None = None
    column: int | None = None
    step_id: str | None = None
    hint: str | None = None


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldError] | None = None


GENERIC_DETAIL = "the server could not handle this request; the error is in its log"
UNAUTHENTICATED_DETAIL = (
    "this request needs a live API token: send `Authorization: Bearer tf_<id>_<secret>`, "
    "as `tideflow tokens create` prints it"
)
"""The one detail of every 401, whatever the reason (which is logged): telling a caller
that a token id exists, or was revoked, helps an attacker."""


def problem_response(
    status: int,
    kind: str,
    request_path: str,
    detail: str | None = None,
    fields: Sequence[FieldError] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = Problem(
        type=TYPE_PREFIX + kind,
        title=HTTPStatus(status).phrase,
        status=status,
        detail=detail,
        instance=request_path,
        errors=list(fields) or None,
    )
    return JSONResponse(
        body.model_dump(exclude_none=True),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=dict(headers or {}),
    )


def row_of(error: type[TideflowError]) -> tuple[int, str]:
    for cls in error.__mro__:
        if cls in ERRORS:
            return ERRORS[cls]
    return ERRORS[TideflowError]


def definition_fields(exc: DefinitionError) -> list[FieldError]:
    """The definition is the request's body: ``body.steps[0].type``, or ``body`` for a
    problem of the whole text (a YAML syntax error, with its line and column)."""
    return [
        FieldError(
            field=f"body.{d.path}" if d.path else "body",
            message=d.message,
            line=d.line,
            column=d.column,
            step_id=d.step_id,
            hint=d.hint,
        )
        for d in exc.diagnostics
        if d.severity == "error"
    ]


def _service_detail(error: type[TideflowError], status: int) -> str:
    """What the class's docstring says (an unavailable service), never the message: it may
    carry hosts, URLs and driver text."""
    if status == 500:
        return GENERIC_DETAIL
    return " ".join((error.__doc__ or "").split()) or GENERIC_DETAIL


def _error_fields(exc: TideflowError) -> list[FieldError]:
    if isinstance(exc, DefinitionError):
        return definition_fields(exc)
    if isinstance(exc, InputValidationError):
        return [FieldError(field=f"body.input{path[1:]}", message=m) for path, m in exc.fields]
    if isinstance(exc, errors.BadCursor):
        return [FieldError(field="query.cursor", message=exc.message)]
    if isinstance(exc, errors.UnknownSignal):
        return [FieldError(field="body.name", message=exc.message)]
    return []


async def _tideflow_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TideflowError)
    if isinstance(exc, errors.Unauthenticated):
        return _unauthenticated(request, exc)
    status, kind = row_of(type(exc))
    if status >= 500:
        log.error("%s %s: %s", request.method, request.url.path, exc, exc_info=exc)
    detail = exc.message if status < 500 else _service_detail(type(exc), status)
    headers = None
    if isinstance(exc, errors.TooManyStreams):
        headers = {"Retry-After": str(exc.retry_after)}
    return problem_response(
        status, kind, request.url.path, detail, _error_fields(exc), headers=headers
    )


def _unauthenticated(request: Request, exc: errors.Unauthenticated) -> JSONResponse:
    """401 with the one generic detail and a ``WWW-Authenticate`` challenge (RFC 6750: no
    error code when no token came, ``invalid_request`` for one of the wrong form,
    ``invalid_token`` for one that is not live); the reason, with the token id, is logged."""
    quiet = isinstance(exc, errors.MissingToken | errors.MalformedToken)
    log.log(
        logging.INFO if quiet else logging.WARNING,
        "401 %s %s: %s",
        request.method,
        request.url.path,
        exc.message,
    )
    challenge = 'Bearer realm="tideflow"'
    if isinstance(exc, errors.MalformedToken):
        challenge += ', error="invalid_request"'
    elif not isinstance(exc, errors.MissingToken):
        challenge += ', error="invalid_token"'
    status, kind = row_of(type(exc))
    return problem_response(
        status,
        kind,
        request.url.path,
        UNAUTHENTICATED_DETAIL,
        headers={"WWW-Authenticate": challenge},
    )


def _location(loc: Iterable[Any]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _at(problem: Mapping[str, Any]) -> str:
    offsets = [part for part in problem["loc"][1:] if isinstance(part, int)]
    return f"{problem['msg']} at character {offsets[0]}" if offsets else str(problem["msg"])


async def _request_invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = list(exc.errors())
    malformed = [p for p in problems if p.get("type") == "json_invalid"]
    if malformed:
        # FastAPI puts the character offset in the location: the field is the body
        where = [FieldError(field="body", message=_at(p)) for p in malformed]
        return problem_response(400, "malformed-json", request.url.path, "malformed JSON", where)
    fields = [FieldError(field=_location(p["loc"]), message=p["msg"]) for p in problems]
    detail = "the request does not have the expected shape"
    return problem_response(422, "request-invalid", request.url.path, detail, fields)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    phrase = HTTPStatus(exc.status_code).phrase
    kind = phrase.lower().replace(" ", "-")
    detail = None if exc.detail == phrase else str(exc.detail)
    if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
        detail = (
            "the JSON body is nested too deeply to read: send arrays and objects nested "
            f"at most {storable.MAX_NESTING} levels deep"
        )
    # FastAPI's own 400 is a body it could not parse (JSON nested too deep, a bad form)
    message = detail or str(exc.detail)
    fields = [FieldError(field="body", message=message)] if exc.status_code == 400 else []
    return problem_response(
        exc.status_code, kind, request.url.path, detail, fields, headers=exc.headers
    )


def install(app: FastAPI, max_body: int) -> None:
    """Every error of ``app`` as a problem; bodies over ``max_body`` bytes refused."""
    app.add_exception_handler(TideflowError, _tideflow_error)
    app.add_exception_handler(RequestValidationError, _request_invalid)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_middleware(Unhandled)
    app.add_middleware(BodyLimit, max_body=max_body)
    document = app.openapi

    def openapi() -> dict[str, Any]:
        schema = document()
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                _errors_as_problems(operation.get("responses", {}))
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _errors_as_problems(responses: dict[str, Any]) -> None:
    """FastAPI documents every response model as ``application/json`` (or as the route's
    own media type: ``text/event-stream`` for a stream); errors are
    ``application/problem+json``."""
    for code, response in responses.items():
        content = response.get("content", {})
        for media in ("application/json", "text/event-stream"):
            if code[:1] in "45" and media in content:
                content[PROBLEM_JSON] = content.pop(media)


class Unhandled:
    """Any other exception: logged with its traceback, answered with a generic 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if started:
                raise
            response = problem_response(500, "internal", scope.get("path", ""), GENERIC_DETAIL)
            await response(scope, receive, send)


class BodyLimit:
    """Refuse a request body over ``max_body`` bytes with 413 before anything parses it:
    by its ``Content-Length`` when it has one, else (chunked) by counting as it arrives.
    The body is read here, whole, and handed on."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or self._over(declared)):
            await self._refuse(scope, receive, send, declared.isdigit())
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                await self._refuse(scope, receive, send, True)
                return
            if not message.get("more_body", False):
                break
        whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    def _over(self, digits: bytes) -> bool:
        """Whether a Content-Length of ASCII ``digits`` is over the limit, compared by length
        first: Python refuses to read an integer of more than 4,300 digits."""
        digits = digits.lstrip(b"0") or b"0"
        return len(digits) > len(str(self.max_body)) or int(digits) > self.max_body

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, too_large: bool) -> None:
        path = scope.get("path", "")
        if not too_large:
            response = problem_response(400, "bad-request", path, "Content-Length is not a number")
        else:
            detail = f"the request body is over the limit of {self.max_body} bytes"
            response = problem_response(413, "content-too-large", path, detail)
        await response(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    async def replayed() -> Message:
        return messages.pop(0) if messages else await receive()

    return replayed
