-- tideflow schema version 12 (PostgreSQL): due timers in the index's own order. due_timers
-- reads `fire_at` in a range ORDER BY fire_at, run_id, timer_id LIMIT n; an index on
-- fire_at alone gives the rows of the range but not that order, so a wide range (the next
-- timer of all: a range up to far ahead) sorted every timer of the range, and on a table
-- of many sleeping runs the planner read the table whole (tests/contract/
-- test_hot_queries.py). With the order's three columns the LIMIT stops after n entries.
CREATE INDEX IF NOT EXISTS timers_due ON timers (fire_at, run_id, timer_id);
DROP INDEX IF EXISTS timers_fire_at;
