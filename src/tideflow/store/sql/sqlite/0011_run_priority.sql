-- tideflow schema version 11 (SQLite): a run's priority and the admission queue
-- (runtime/admission.py). priority: 0 high, 1 normal, 2 low (rows written before read as
-- normal). An engine keeps a bounded number of runs active; the others wait `pending`
-- and are admitted by priority, then age, then run id: runs_pending is that order, and
-- holds only pending rows, so reading the head of the queue or counting the runs ahead
-- of one costs O(log n + k) whatever the history holds.
ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 1;
CREATE INDEX runs_pending ON runs (priority, created_at, run_id) WHERE status = 'pending';
