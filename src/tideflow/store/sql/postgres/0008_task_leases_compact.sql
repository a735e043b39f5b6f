-- tideflow schema version 8 (PostgreSQL): the index on task_leases.lease_until is gone. It
-- served only expired_tasks, which an engine reads once when it starts (recovery), while
-- every commit (a step's row goes, the next one's comes) paid for it. The rows are the
-- attempts in flight, not the runs, so that read scans a small table. (SQLite also keys
-- the table by its primary key alone, WITHOUT ROWID, which PostgreSQL has no use for.)
DROP INDEX IF EXISTS task_leases_until;
