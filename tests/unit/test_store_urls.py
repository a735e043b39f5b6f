"""`postgresql://…?schema=NAME` picks the store's schema; the option never reaches the
driver."""

from __future__ import annotations

import pytest

from tideflow.store import StoreError, open_store


def test_a_schema_option_is_the_stores_schema_and_leaves_the_url():
    store = open_store("postgresql://kim:pw@db:5432/flows?schema=team_a&sslmode=disable")
    assert store.schema == "team_a"  # type: ignore[attr-defined]
    assert store.url == "postgresql://kim:pw@db:5432/flows?sslmode=disable"


@pytest.mark.parametrize("query", ["schema=", "schema=a&schema=b"])
def test_an_empty_or_repeated_schema_is_refused(query):
    with pytest.raises(StoreError, match="one non-empty schema"):
        open_store(f"postgresql://db/flows?{query}")
