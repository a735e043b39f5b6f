-- tideflow schema version 10 (PostgreSQL): what the event gateway did with each event it
-- answered (runtime/intake.py, docs/events.md). One row per event, keyed by its
-- (source, id) (api/events.py signal_id): a redelivery finds it and is answered
-- `duplicate`. status: delivered (handed to runs or starting them), buffered (kept
-- until buffer_until for a run whose wait is not reached yet, found through
-- gateway_event_rows), unmatched (the dead letter: listed and replayable; a buffered row
-- whose buffer_until passed is unmatched too). Rows are pruned retention after
-- buffer_until (`tideflow db prune`).
CREATE TABLE gateway_events (
    event_key    TEXT COLLATE "C" PRIMARY KEY,
    source       TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    type         TEXT NOT NULL,
    run_id       TEXT,
    payload      TEXT NOT NULL,
    status       TEXT COLLATE "C" NOT NULL,
    received_at  DOUBLE PRECISION NOT NULL,
    buffer_until DOUBLE PRECISION NOT NULL,
    delivered_to TEXT NOT NULL,
    started      TEXT NOT NULL,
    reason       TEXT
);
CREATE INDEX gateway_events_status ON gateway_events (status, buffer_until);
-- The wait rows (store/indexrows.py) a buffered event can be found under: its type, and
-- type · path · value for each path a registered wait on its type correlates by.
CREATE TABLE gateway_event_rows (
    wait_row  TEXT COLLATE "C" NOT NULL,
    event_key TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (wait_row, event_key)
);
CREATE INDEX gateway_event_rows_key ON gateway_event_rows (event_key);
