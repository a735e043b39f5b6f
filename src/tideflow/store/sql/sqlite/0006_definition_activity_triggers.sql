-- tideflow schema version 6 (SQLite): a definition version can be deactivated (it starts
-- no new run; runs of it go on), and the event types that start runs of a definition
-- (its `triggers:`) are indexed, so an event finds the definitions it starts without
-- reading every plan. Every version registered before is active and has no trigger.
ALTER TABLE definitions ADD COLUMN active INTEGER NOT NULL DEFAULT 1;

CREATE TABLE definition_triggers (
    event    TEXT NOT NULL,
    name     TEXT NOT NULL,
    version  TEXT NOT NULL,
    PRIMARY KEY (event, name, version)
);
