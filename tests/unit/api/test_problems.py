"""Every class of the error tree has its status decided, and its problem says what the
caller may know (a 5xx says nothing of the server's inside)."""

from __future__ import annotations

import inspect

import httpx
from fastapi import FastAPI

from tideflow import errors
from tideflow.api.problems import ERRORS, UNAUTHENTICATED_DETAIL, install, row_of
from tideflow.errors import TideflowError


def test_every_error_class_of_the_tree_is_mapped_deliberately() -> None:
    tree = {
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, TideflowError) and cls.__module__ == errors.__name__
    }
    assert tree - set(ERRORS) == set(), "add a row to tideflow.api.problems.ERRORS"
    assert set(ERRORS) - tree == set()


def test_a_subclass_takes_its_nearest_base_row() -> None:
    from tideflow.worker.executors.errors import HttpError

    assert row_of(HttpError) == ERRORS[errors.StepError]


async def test_each_mapped_status_reaches_the_caller_with_its_type() -> None:
    app = FastAPI()
    install(app, 1 << 20)
    raised: dict[str, TideflowError] = {}

    @app.get("/raise/{name}")
    async def raise_one(name: str) -> None:
        raise raised[name]

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
        for cls, (status, kind) in ERRORS.items():
            raised[cls.__name__] = cls("secret inside")
            response = await api.get(f"/raise/{cls.__name__}")
            body = response.json()
            assert (response.status_code, body["type"]) == (status, f"urn:tideflow:problem:{kind}")
            # a 401 has one detail whatever the reason: the message is for the log
            told = status < 500 and status != 401
            assert ("secret inside" in body["detail"]) is told, cls
            if status == 401:
                assert body["detail"] == UNAUTHENTICATED_DETAIL
                assert response.headers["www-authenticate"].startswith("Bearer"), cls
