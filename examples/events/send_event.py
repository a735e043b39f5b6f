"""Send one CloudEvent to tideflow's event gateway (``POST /events``), in binary mode:
the data is the body, the attributes are ``ce-*`` headers. Only the standard library
and httpx.

An ``hmac`` source signs it with the v2 scheme (docs/events.md, "Signatures"): the
HMAC-SHA256, under the source's secret, of the canonical request -- the timestamp, the
method, the path, the Content-Type, every ``ce-*`` header and the body's SHA-256 -- so
no header that routes the event can be changed under the signature. A ``bearer``
source sends its token instead.

    export PAY_WEBHOOK_SECRET=...        # the source's secret, as the server has it
    python examples/events/send_event.py http://127.0.0.1:8080 \\
        --source https://pay.example.com/webhooks --type com.example.payment.succeeded \\
        --id pay-7781 --data '{"order_id": "o-42", "amount": 129.5}'

    export APPROVALS_TOKEN=...
    python examples/events/send_event.py http://127.0.0.1:8080 --token-env APPROVALS_TOKEN \\
        --source urn:approvals:desk --type com.example.order.approved \\
        --id approval-1 --run 0193... --data '{"by": "ada"}'

Prints the gateway's answer; exits 0 when it took the event (2xx), 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
import time
from collections.abc import Mapping

import httpx

PATH = "/events"


def percent_encoded(value: str) -> str:
    """A ``ce-*`` header value as the CloudEvents HTTP binding writes it: printable
    ASCII but ``"`` and ``%`` as is, every other character's UTF-8 bytes as ``%XX``."""
    out = []
    for char in value:
        if "!" <= char <= "~" and char not in '"%':
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(out)


def canonical_request(
    timestamp: str, method: str, path: str, headers: Mapping[str, str], body: bytes
) -> bytes:
    """What a v2 signature signs: these lines joined by a newline."""
    lowered = {name.lower(): value.strip() for name, value in headers.items()}
    lines = [
        "tideflow-v2",
        timestamp,
        method.upper(),
        path,
        lowered.get("content-type", ""),
        *(f"{name}:{value}" for name, value in sorted(lowered.items()) if name.startswith("ce-")),
        hashlib.sha256(body).hexdigest(),
    ]
    return "\n".join(lines).encode("utf-8")


def signed(secret: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
    """``headers`` with ``X-Tideflow-Timestamp`` and a v2 ``X-Tideflow-Signature``."""
    timestamp = str(int(time.time()))
    message = canonical_request(timestamp, "POST", PATH, headers, body)
    digest = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return {**headers, "x-tideflow-timestamp": timestamp, "x-tideflow-signature": f"v2={digest}"}


def send(url: str, args: argparse.Namespace) -> httpx.Response:
    attributes = {"specversion": "1.0", "id": args.id, "source": args.source, "type": args.type}
    if args.run:
        attributes["tideflowrunid"] = args.run
    headers = {f"ce-{name}": percent_encoded(value) for name, value in attributes.items()}
    headers["content-type"] = "application/json"
    body = json.dumps(json.loads(args.data)).encode()
    if args.token_env:
        headers["authorization"] = f"Bearer {os.environ[args.token_env]}"
    else:
        headers = signed(os.environ[args.secret_env], headers, body)
    return httpx.post(url.rstrip("/") + PATH, content=body, headers=headers, timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the API's base URL, such as http://127.0.0.1:8080")
    parser.add_argument("--source", required=True)
    parser.add_argument("--type", required=True)
    parser.add_argument("--id", required=True, help="the event's id: the same on a resend")
    parser.add_argument("--data", default="null", help="the event's data, JSON")
    parser.add_argument("--run", help="send to this run only (the source needs address_runs)")
    parser.add_argument("--secret-env", default="PAY_WEBHOOK_SECRET", help="hmac: its secret")
    parser.add_argument("--token-env", help="bearer: the variable that holds the token")
    args = parser.parse_args(argv)
    answer = send(args.url, args)
    print(answer.text)
    return 0 if answer.is_success else 1


if __name__ == "__main__":
    sys.exit(main())
