-- tideflow schema version 8 (SQLite): task_leases, one row per attempt in flight, written by
-- nearly every commit (a step's row goes, the next one's comes), in fewer pages. The table is
-- keyed by its primary key (WITHOUT ROWID: one B-tree, not a table and an index beside it),
-- and the index on lease_until is gone: it served only expired_tasks, which an engine reads
-- once when it starts (recovery), while every commit paid a page for it. The rows are the
-- attempts in flight, not the runs, so that read scans a small table.
CREATE TABLE task_leases_8 (
    run_id         TEXT NOT NULL,
    step_key       TEXT NOT NULL,
    attempt        INTEGER NOT NULL,
    dispatched_at  REAL NOT NULL,
    started_at     REAL,
    owner          TEXT,
    lease_until    REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, step_key)
) WITHOUT ROWID;
INSERT INTO task_leases_8 (run_id, step_key, attempt, dispatched_at, started_at, owner, lease_until)
SELECT run_id, step_key, attempt, dispatched_at, started_at, owner, lease_until FROM task_leases;
DROP TABLE task_leases;
ALTER TABLE task_leases_8 RENAME TO task_leases;
