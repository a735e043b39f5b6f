-- tideflow schema version 3 (SQLite): one engine per store, and events for it.
-- The engine lease: one row per lease name ("engine" in embedded mode), renewed by the
-- holder's heartbeat; a row whose expires_at has passed may be taken over.
CREATE TABLE engine_leases (
    name         TEXT PRIMARY KEY,
    owner        TEXT NOT NULL,
    kind         TEXT NOT NULL,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    address      TEXT,
    acquired_at  REAL NOT NULL,
    expires_at   REAL NOT NULL
);

-- Events other processes recorded for the engine (signal, cancel, retry, start), applied
-- by the live engine when notified and by the next engine on start; keyed by event id.
CREATE TABLE inbox (
    event_id    TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    event       TEXT NOT NULL
);
CREATE INDEX inbox_created ON inbox (created_at);
