"""Step functions of the ETL example (``examples/etl.yaml``).

Extract orders (CSV) and customers (JSON) from ``examples/data/``, transform them
into one record per order with the amount in euro cents, validate the records
against business rules, and load the valid ones into a SQLite database (in
memory by default, so running the example leaves nothing behind) and report
revenue per region.

Each function takes and returns plain JSON data: that is all that travels
between steps, and it is what the run history records.
"""

from __future__ import annotations

import contextlib
import csv
import json
import sqlite3
from datetime import date
from pathlib import Path
from typing import Any, TypedDict

__all__ = [
    "DataQualityError",
    "extract_customers",
    "extract_orders",
    "load",
    "transform",
    "validate",
]

DATA_DIR = Path(__file__).parent / "data"

EUR_PER_UNIT: dict[str, float] = {"EUR": 1.0, "GBP": 1.17, "USD": 0.92}
"""Fixed conversion rates, so the example is deterministic."""


class Record(TypedDict):
    order_id: str
    customer_id: str
    customer: str | None
    region: str | None
    amount_cents: int | None
    ordered_on: str


class DataQualityError(Exception):
    """Too many records broke the rules; loading them would poison the warehouse."""


def extract_orders(file: str = "orders.csv") -> dict[str, Any]:
    """Rows of the orders export, as strings, exactly as they are in the file."""
    with (DATA_DIR / file).open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {"source": file, "rows": rows}


def extract_customers(file: str = "customers.json") -> dict[str, Any]:
    """The customer master data."""
    rows = json.loads((DATA_DIR / file).read_text(encoding="utf-8"))
    return {"source": file, "rows": rows}


def _to_cents(amount: str, currency: str) -> int | None:
    rate = EUR_PER_UNIT.get(currency.upper())
    if rate is None:
        return None
    return round(float(amount) * rate * 100)


def transform(orders: list[dict[str, str]], customers: list[dict[str, str]]) -> dict[str, Any]:
    """Join orders with customers; amounts become integer euro cents."""
    by_id = {c["id"]: c for c in customers}
    records: list[Record] = []
    for row in orders:
        customer = by_id.get(row["customer_id"])
        records.append(
            {
                "order_id": row["order_id"],
                "customer_id": row["customer_id"],
                "customer": customer["name"] if customer else None,
                "region": customer["region"] if customer else None,
                "amount_cents": _to_cents(row["amount"], row["currency"]),
                "ordered_on": row["ordered_at"],
            }
        )
    return {"records": records}


def _problems(record: Record) -> list[str]:
    problems: list[str] = []
    if record["customer"] is None:
        problems.append(f"unknown customer {record['customer_id']}")
    if record["amount_cents"] is None:
        problems.append("unknown currency")
    elif record["amount_cents"] <= 0:
        problems.append(f"amount must be positive, got {record['amount_cents']} cents")
    try:
        date.fromisoformat(record["ordered_on"])
    except ValueError:
        problems.append(f"bad date {record['ordered_on']!r}")
    return problems


def validate(records: list[Record], max_invalid_ratio: float) -> dict[str, Any]:
    """Split records into valid and invalid ones; fail when too many are invalid."""
    valid: list[Record] = []
    invalid: list[dict[str, Any]] = []
    for record in records:
        problems = _problems(record)
        if problems:
            invalid.append({"order_id": record["order_id"], "problems": problems})
        else:
            valid.append(record)
    if records and len(invalid) / len(records) > max_invalid_ratio:
        raise DataQualityError(
            f"{len(invalid)} of {len(records)} records are invalid "
            f"(more than {max_invalid_ratio:.0%}); nothing was loaded"
        )
    return {"valid": valid, "invalid": invalid}


def load(records: list[Record], batch: str, database: str = ":memory:") -> dict[str, Any]:
    """Insert the records into ``fact_orders`` and read revenue per region back."""
    # closing(): sqlite3's own context manager commits but does not close.
    with contextlib.closing(sqlite3.connect(database)) as db, db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS fact_orders (order_id TEXT PRIMARY KEY, "
            "customer_id TEXT, region TEXT, amount_cents INTEGER, ordered_on TEXT, batch TEXT)"
        )
        # INSERT OR REPLACE: loading the same batch again (a retried step) is harmless.
        db.executemany(
            "INSERT OR REPLACE INTO fact_orders VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    r["order_id"],
                    r["customer_id"],
                    r["region"],
                    r["amount_cents"],
                    r["ordered_on"],
                    batch,
                )
                for r in records
            ],
        )
        revenue = db.execute(
            "SELECT region, SUM(amount_cents) FROM fact_orders GROUP BY region ORDER BY region"
        ).fetchall()
    return {
        "table": "fact_orders",
        "rows_loaded": len(records),
        "revenue_by_region_cents": dict(revenue),
    }
