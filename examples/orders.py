"""Step functions of the order saga (``examples/order_saga.yaml``).

Inventory, payments and shipping are in-memory stand-ins for real services. Every
call, including the compensations that undo a step, is appended to `LEDGER` as
``(action, order_id)``, so a test (or you, in a REPL) can see what ran and in
which order: ``calls_for("A2")`` after a failed shipment reads
``["reserve", "charge", "ship_rejected", "refund", "release"]``.

Failures are requested through the run input, never random:

- ``flaky_charges: N`` makes the first N charge attempts fail with
  `PaymentGatewayUnavailable` (a `ConnectionError`, which the step retries);
- ``fail_shipping: true`` makes the carrier reject the address with
  `AddressRejected` (a `ValueError`, which is not retried), so the run
  compensates.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from tideflow.worker.executors.base import StepContext

__all__ = [
    "LEDGER",
    "AddressRejected",
    "OutOfStock",
    "PaymentGatewayUnavailable",
    "calls_for",
    "charge_payment",
    "refund_payment",
    "release_inventory",
    "reserve_inventory",
    "ship_order",
]

LEDGER: list[tuple[str, str]] = []
"""``(action, order_id)`` for every call, in call order."""

STOCK: dict[str, int] = {"SKU-1": 100, "SKU-2": 25, "SKU-3": 0}
"""Units on hand per SKU (SKU-3 is sold out)."""

_lock = threading.Lock()  # sync step functions run in the worker's thread pool


class LineItem(TypedDict):
    sku: str
    quantity: int


class OutOfStock(Exception):
    """A line item cannot be reserved."""


class PaymentGatewayUnavailable(ConnectionError):
    """The payment provider did not answer; safe to retry with the same idempotency key."""


class AddressRejected(ValueError):
    """The carrier refused the delivery address; retrying will not help."""


def _record(action: str, order_id: str) -> None:
    with _lock:
        LEDGER.append((action, order_id))


def calls_for(order_id: str) -> list[str]:
    """The actions recorded for one order, in order."""
    with _lock:
        return [action for action, order in LEDGER if order == order_id]


def reserve_inventory(order_id: str, items: list[LineItem]) -> dict[str, Any]:
    """Hold stock for every line item; all or nothing."""
    with _lock:
        missing = [i["sku"] for i in items if STOCK.get(i["sku"], 0) < i["quantity"]]
        if missing:
            raise OutOfStock(f"not enough stock for {', '.join(missing)}")
        for item in items:
            STOCK[item["sku"]] -= item["quantity"]
    _record("reserve", order_id)
    units = sum(item["quantity"] for item in items)
    return {"reservation_id": f"res-{order_id}", "items": list(items), "units": units}


def release_inventory(order_id: str, reservation_id: str, items: list[LineItem]) -> dict[str, Any]:
    """Compensation of `reserve_inventory`: put the held stock back."""
    with _lock:
        for item in items:
            STOCK[item["sku"]] = STOCK.get(item["sku"], 0) + item["quantity"]
    _record("release", order_id)
    return {"released": reservation_id}


def charge_payment(
    order_id: str, amount: float, flaky_attempts: int, ctx: StepContext
) -> dict[str, Any]:
    """Charge the customer. The provider deduplicates on the idempotency key, which
    tideflow keeps the same for every attempt of the step."""
    if ctx.attempt <= flaky_attempts:
        _record("charge_timeout", order_id)
        raise PaymentGatewayUnavailable(f"payment gateway timed out (attempt {ctx.attempt})")
    _record("charge", order_id)
    return {
        "charge_id": f"ch-{order_id}",
        "amount": amount,
        "attempt": ctx.attempt,
        "idempotency_key": ctx.idempotency_key,
    }


def refund_payment(order_id: str, charge_id: str, amount: float) -> dict[str, Any]:
    """Compensation of `charge_payment`."""
    _record("refund", order_id)
    return {"refunded": charge_id, "amount": amount}


def ship_order(order_id: str, address: str, reject_address: bool) -> dict[str, Any]:
    """Hand the parcel to the carrier."""
    if reject_address or not address.strip():
        _record("ship_rejected", order_id)
        raise AddressRejected(f"carrier rejected the address {address!r} for order {order_id}")
    _record("ship", order_id)
    return {"tracking_number": f"TRK-{order_id}", "address": address}
