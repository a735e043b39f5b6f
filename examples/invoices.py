"""Step functions of the invoice batch (``examples/map_items.yaml``).

`send_invoice` runs once per invoice, as the template of a ``map`` step. It is
async (it runs on the worker's event loop, no thread) and "sends" by appending
to `OUTBOX`. It also keeps count of how many sends are in flight at once, so
you can see ``max_concurrency`` at work: `PEAK_IN_FLIGHT` never exceeds it.

Failures come from the data, not from chance:

- an address without ``@`` raises `InvalidRecipient` (not retried: the address
  will not fix itself);
- an address at ``greylist.example`` raises `MailServerBusy` on the first
  attempt, like a greylisting mail server, and succeeds on the retry.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from tideflow.worker.executors.base import StepContext

__all__ = [
    "OUTBOX",
    "InvalidRecipient",
    "MailServerBusy",
    "in_flight",
    "peak_in_flight",
    "reset",
    "send_invoice",
    "summarise",
]


class Invoice(TypedDict):
    invoice_id: str
    email: str
    amount: float


class InvalidRecipient(ValueError):
    """The invoice's address cannot receive mail."""


class MailServerBusy(ConnectionError):
    """A temporary refusal; the same message is accepted later."""


OUTBOX: list[dict[str, Any]] = []
"""Every invoice sent, in the order sending finished."""

_in_flight = 0
_peak = 0


def reset() -> None:
    """Forget what was sent and the concurrency peak (for tests)."""
    global _in_flight, _peak
    OUTBOX.clear()
    _in_flight = 0
    _peak = 0


def in_flight() -> int:
    return _in_flight


def peak_in_flight() -> int:
    """The most `send_invoice` calls that were running at the same time."""
    return _peak


async def send_invoice(
    batch_id: str, invoice: Invoice, position: int, ctx: StepContext
) -> dict[str, Any]:
    """Render and send one invoice e-mail."""
    global _in_flight, _peak
    _in_flight += 1
    _peak = max(_peak, _in_flight)
    try:
        await asyncio.sleep(0.02)  # the SMTP round trip
        email = invoice["email"]
        if "@" not in email:
            raise InvalidRecipient(f"invoice {invoice['invoice_id']}: {email!r} is not an address")
        if email.endswith("@greylist.example") and ctx.attempt == 1:
            raise MailServerBusy(f"{email}: 451 greylisted, try again later")
        message_id = f"<{batch_id}.{invoice['invoice_id']}@billing.example>"
        OUTBOX.append({"to": email, "invoice_id": invoice["invoice_id"], "message_id": message_id})
        return {
            "invoice_id": invoice["invoice_id"],
            "message_id": message_id,
            "position": position,
            "attempt": ctx.attempt,
        }
    finally:
        _in_flight -= 1


def summarise(invoices: list[Invoice], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Which invoices went out and which need a person to look at them (a failed item's
    slot holds ``{"error": {type, message}, "index": i}``)."""
    ok = [inv for inv, r in zip(invoices, results, strict=True) if "error" not in r]
    sent = [r["invoice_id"] for r in results if "error" not in r]
    failed = [invoices[r["index"]]["invoice_id"] for r in results if "error" in r]
    total = sum(inv["amount"] for inv in ok)
    return {"sent": sent, "failed": failed, "amount_sent": round(total, 2)}
