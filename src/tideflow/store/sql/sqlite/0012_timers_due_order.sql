-- tideflow schema version 12 (SQLite): due timers in the index's own order. due_timers
-- reads `fire_at` in a range ORDER BY fire_at, run_id, timer_id LIMIT n; an index on
-- fire_at alone gives the rows of the range but not that order (a temporary B-tree sorted
-- every timer of the range). With the order's three columns the LIMIT stops after n.
CREATE INDEX IF NOT EXISTS timers_due ON timers (fire_at, run_id, timer_id);
DROP INDEX IF EXISTS timers_fire_at;
