#!/usr/bin/env bash
# Send one CloudEvent to tideflow's event gateway in binary mode, signed for an hmac
# source with the v2 scheme (docs/events.md, "Signatures"), with curl and openssl only.
#
#   PAY_WEBHOOK_SECRET=... examples/events/send_event.sh API ID SOURCE TYPE DATA [RUN]
#   examples/events/send_event.sh http://127.0.0.1:8080 pay-7781 \
#     https://pay.example.com/webhooks com.example.payment.succeeded \
#     '{"order_id": "o-42", "amount": 129.5}'
#
# The attributes go in ce-* headers as they are (give them in printable ASCII, no `"`
# or `%`; CloudEvents percent-encodes anything else). Prints the gateway's answer and
# exits non-zero unless it took the event (2xx).
set -euo pipefail

API=$1 ID=$2 SOURCE=$3 TYPE=$4 DATA=$5 RUN=${6:-}
SECRET=${PAY_WEBHOOK_SECRET:?set it to the secret of the source, as the server has it}
CONTENT_TYPE=application/json
TS=$(date +%s)

# the ce-* headers, names lower-case; the canonical request lists them sorted by name
CE=("ce-id:$ID" "ce-source:$SOURCE" "ce-specversion:1.0" "ce-type:$TYPE")
if [ -n "$RUN" ]; then CE+=("ce-tideflowrunid:$RUN"); fi
mapfile -t SORTED < <(printf '%s\n' "${CE[@]}" | LC_ALL=C sort)

BODY_SHA=$(printf '%s' "$DATA" | openssl dgst -sha256 -r | cut -d' ' -f1)
CANONICAL=$(printf '%s\n' tideflow-v2 "$TS" POST /events "$CONTENT_TYPE" "${SORTED[@]}"; printf '%s' "$BODY_SHA")
SIG=$(printf '%s' "$CANONICAL" | openssl dgst -sha256 -hmac "$SECRET" -r | cut -d' ' -f1)

HEADERS=(-H "content-type: $CONTENT_TYPE" -H "x-tideflow-timestamp: $TS" -H "x-tideflow-signature: v2=$SIG")
for line in "${CE[@]}"; do HEADERS+=(-H "${line%%:*}: ${line#*:}"); done
curl -sS --fail-with-body "$API/events" "${HEADERS[@]}" --data-binary "$DATA"
echo
