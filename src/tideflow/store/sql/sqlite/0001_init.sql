-- tideflow schema version 1 (SQLite)
CREATE TABLE plans (
    hash        TEXT PRIMARY KEY,
    source      TEXT NOT NULL
);

CREATE TABLE definitions (
    name        TEXT NOT NULL,
    version     TEXT NOT NULL,
    hash        TEXT NOT NULL REFERENCES plans (hash),
    created_at  REAL NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    workflow         TEXT NOT NULL,
    version          TEXT NOT NULL,
    plan_hash        TEXT NOT NULL,
    status           TEXT NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    finished_at      REAL,
    parent_run_id    TEXT,
    idempotency_key  TEXT UNIQUE,
    last_seq         INTEGER NOT NULL DEFAULT 0,
    snapshot_seq     INTEGER NOT NULL DEFAULT 0,
    snapshot         TEXT NOT NULL,
    output           TEXT,
    error            TEXT
);
CREATE INDEX runs_created ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_status_created ON runs (status, created_at DESC, run_id DESC);
CREATE INDEX runs_workflow_created ON runs (workflow, created_at DESC, run_id DESC);
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE history (
    run_id       TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    event_id     TEXT NOT NULL UNIQUE,
    kind         TEXT NOT NULL,
    time         REAL NOT NULL,
    data         TEXT NOT NULL,
    transitions  TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE outbox (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    command     TEXT NOT NULL
);
CREATE INDEX outbox_created ON outbox (created_at);
