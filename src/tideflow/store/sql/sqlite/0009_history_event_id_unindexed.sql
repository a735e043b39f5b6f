-- tideflow schema version 9 (SQLite): history without its unique index on event_id. Every
-- event a commit stores paid a page of that index (one in five of a step's commit), on a
-- random place in it, and nothing reads by it: the engine never stores an event that changed
-- nothing (duplicates and stale events are dropped by the pure core, signals by the ids the
-- run has seen), and history is read by run and sequence. SQLite cannot drop a column's
-- UNIQUE, so the table is rebuilt: the rows are copied once, in their order.
CREATE TABLE history_9 (
    run_id       TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    event_id     TEXT NOT NULL,
    kind         TEXT NOT NULL,
    time         REAL NOT NULL,
    data         TEXT NOT NULL,
    transitions  TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
INSERT INTO history_9 (rowid, run_id, seq, event_id, kind, time, data, transitions)
SELECT rowid, run_id, seq, event_id, kind, time, data, transitions FROM history ORDER BY rowid;
DROP TABLE history;
ALTER TABLE history_9 RENAME TO history;
