-- tideflow schema version 7 (SQLite): schedules (model/schedules.py). One row per live
-- schedule of a workflow: from the `schedule:` of its highest active version (origin
-- 'definition'), or made through the client ('client'). fire_at is the durable timer of
-- its next slot (next_slot plus jitter; NULL when no slot is left); a server arms its
-- wake-up from the soonest one. revision makes every update conditional on the row as it
-- was read, so two servers advancing one schedule never both win. A deleted row is kept
-- (deleted = 1) so that the same definition version registered again does not revive it.
CREATE TABLE schedules (
    workflow       TEXT NOT NULL,
    schedule_id    TEXT NOT NULL,
    version        TEXT,
    origin         TEXT NOT NULL,
    spec           TEXT NOT NULL,
    paused         INTEGER NOT NULL DEFAULT 0,
    deleted        INTEGER NOT NULL DEFAULT 0,
    next_slot      REAL,
    fire_at        REAL,
    last_slot      REAL,
    last_run_id    TEXT,
    buffered_slot  REAL,
    revision       INTEGER NOT NULL DEFAULT 0,
    updated_at     REAL NOT NULL,
    PRIMARY KEY (workflow, schedule_id)
);

CREATE INDEX schedules_fire_at ON schedules (fire_at)
    WHERE paused = 0 AND deleted = 0 AND fire_at IS NOT NULL;
