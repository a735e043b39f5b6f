-- tideflow schema version 7 (PostgreSQL): schedules (model/schedules.py). One row per live
-- schedule of a workflow: from the `schedule:` of its highest active version (origin
-- 'definition'), or made through the client ('client'). fire_at is the durable timer of
-- its next slot (next_slot plus jitter; NULL when no slot is left); a server arms its
-- wake-up from the soonest one. revision makes every update conditional on the row as it
-- was read, so two servers advancing one schedule never both win. A deleted row is kept
-- (deleted) so that the same definition version registered again does not revive it.
CREATE TABLE schedules (
    workflow       TEXT COLLATE "C" NOT NULL,
    schedule_id    TEXT COLLATE "C" NOT NULL,
    version        TEXT COLLATE "C",
    origin         TEXT COLLATE "C" NOT NULL,
    spec           TEXT NOT NULL,
    paused         BOOLEAN NOT NULL DEFAULT FALSE,
    deleted        BOOLEAN NOT NULL DEFAULT FALSE,
    next_slot      DOUBLE PRECISION,
    fire_at        DOUBLE PRECISION,
    last_slot      DOUBLE PRECISION,
    last_run_id    TEXT COLLATE "C",
    buffered_slot  DOUBLE PRECISION,
    revision       BIGINT NOT NULL DEFAULT 0,
    updated_at     DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (workflow, schedule_id)
);

CREATE INDEX schedules_fire_at ON schedules (fire_at)
    WHERE NOT paused AND NOT deleted AND fire_at IS NOT NULL;
