-- tideflow schema version 2 (SQLite): timers, task leases and waits as indexed rows,
-- kept current by every commit, so that an engine reads what is due, expired or waiting
-- without loading the runs.
CREATE TABLE timers (
    run_id    TEXT NOT NULL,
    timer_id  TEXT NOT NULL,
    fire_at   REAL NOT NULL,
    PRIMARY KEY (run_id, timer_id)
);
CREATE INDEX timers_fire_at ON timers (fire_at);

-- One row per attempt in flight (dispatched, not yet finished). lease_until 0: nobody
-- holds it (a worker claims it with a lease and extends it while it runs).
CREATE TABLE task_leases (
    run_id         TEXT NOT NULL,
    step_key       TEXT NOT NULL,
    attempt        INTEGER NOT NULL,
    dispatched_at  REAL NOT NULL,
    started_at     REAL,
    owner          TEXT,
    lease_until    REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, step_key)
);
CREATE INDEX task_leases_until ON task_leases (lease_until);

CREATE TABLE waits (
    signal  TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    PRIMARY KEY (signal, run_id)
);
CREATE INDEX waits_run ON waits (run_id);

-- Runs left unfinished by schema 1 have no rows yet: the next engine writes them from
-- each run's state (Store.index_run) before it reads the rows.
CREATE TABLE unindexed_runs (
    run_id  TEXT PRIMARY KEY
);
INSERT INTO unindexed_runs (run_id)
SELECT run_id FROM runs
WHERE status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out', 'compensated', 'compensation_failed');
