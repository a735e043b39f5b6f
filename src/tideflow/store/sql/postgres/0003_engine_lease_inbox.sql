-- tideflow schema version 3 (PostgreSQL): one engine per store, and events for it.
-- The engine lease: one row per lease name ("engine" in embedded mode), renewed by the
-- holder's heartbeat; a row whose expires_at has passed may be taken over.
CREATE TABLE engine_leases (
    name         TEXT COLLATE "C" PRIMARY KEY,
    owner        TEXT COLLATE "C" NOT NULL,
    kind         TEXT COLLATE "C" NOT NULL,
    host         TEXT NOT NULL,
    pid          BIGINT NOT NULL,
    address      TEXT,
    acquired_at  DOUBLE PRECISION NOT NULL,
    expires_at   DOUBLE PRECISION NOT NULL
);

-- Events other processes recorded for the engine (signal, cancel, retry, start), applied
-- by the live engine when notified (NOTIFY) and by the next engine on start.
CREATE TABLE inbox (
    event_id    TEXT COLLATE "C" PRIMARY KEY,
    run_id      TEXT COLLATE "C" NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    event       TEXT NOT NULL
);
CREATE INDEX inbox_created ON inbox (created_at);
