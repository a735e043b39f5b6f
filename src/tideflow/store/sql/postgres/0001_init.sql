-- tideflow schema version 1 (PostgreSQL)
-- Keys and names compare byte-wise (COLLATE "C"), as in SQLite: the same order on every
-- server whatever its locale, and cheaper index comparisons.
CREATE TABLE plans (
    hash        TEXT COLLATE "C" PRIMARY KEY,
    source      TEXT NOT NULL
);

CREATE TABLE definitions (
    name        TEXT COLLATE "C" NOT NULL,
    version     TEXT COLLATE "C" NOT NULL,
    hash        TEXT COLLATE "C" NOT NULL REFERENCES plans (hash),
    created_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE runs (
    run_id           TEXT COLLATE "C" PRIMARY KEY,
    workflow         TEXT COLLATE "C" NOT NULL,
    version          TEXT COLLATE "C" NOT NULL,
    plan_hash        TEXT COLLATE "C" NOT NULL,
    status           TEXT COLLATE "C" NOT NULL,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    finished_at      DOUBLE PRECISION,
    parent_run_id    TEXT COLLATE "C",
    idempotency_key  TEXT COLLATE "C" UNIQUE,
    last_seq         BIGINT NOT NULL DEFAULT 0,
    snapshot_seq     BIGINT NOT NULL DEFAULT 0,
    snapshot         TEXT NOT NULL,
    output           TEXT,
    error            TEXT
);
CREATE INDEX runs_created ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_status_created ON runs (status, created_at DESC, run_id DESC);
CREATE INDEX runs_workflow_created ON runs (workflow, created_at DESC, run_id DESC);
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE history (
    run_id       TEXT COLLATE "C" NOT NULL,
    seq          BIGINT NOT NULL,
    event_id     TEXT COLLATE "C" NOT NULL UNIQUE,
    kind         TEXT COLLATE "C" NOT NULL,
    time         DOUBLE PRECISION NOT NULL,
    data         TEXT NOT NULL,
    transitions  TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE outbox (
    id          TEXT COLLATE "C" PRIMARY KEY,
    run_id      TEXT COLLATE "C" NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    command     TEXT NOT NULL
);
CREATE INDEX outbox_created ON outbox (created_at);
