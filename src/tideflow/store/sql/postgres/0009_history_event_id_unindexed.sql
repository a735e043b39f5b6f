-- tideflow schema version 9 (PostgreSQL): history without its unique index on event_id.
-- Every event a commit stores paid an entry in that index, and nothing reads by it: the
-- engine never stores an event that changed nothing (duplicates and stale events are dropped
-- by the pure core, signals by the ids the run has seen), and history is read by run and
-- sequence.
ALTER TABLE history DROP CONSTRAINT IF EXISTS history_event_id_key;
