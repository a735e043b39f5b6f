-- tideflow schema version 13 (PostgreSQL): tideflow_commit writes each kind of row with one
-- statement, not one per row. Migration 4's function looped row by row for the runs, the
-- snapshots, the timers that went, the task rows done and the attempts started: a full
-- batch (512 events of a chain of steps) ran some 1,500 single-row statements inside the
-- call, and the call took 40 to 60 ms at p99 under a backlog (issue 28 asks for 10 ms).
-- Now a run's new values and its snapshot are one UPDATE of the batch's runs, joined to
-- the document's rows (one new version of each run's row per commit, not two: the
-- snapshot used to be a second UPDATE of the same row), and the timers, task rows and
-- starts are one DELETE or UPDATE each, joined the same way.
--
-- The document is migration 4's, but a run's row carries its snapshot (seq and state, or
-- nulls when the batch took none) as its 9th and 10th values; a `snapshots` key, which an
-- engine started before this migration still sends, is still written.
--
-- Stale runs: the runs UPDATE returns the runs it advanced; a run of the batch it did
-- not advance (its last_seq moved on, or it is gone) raises SQLSTATE TF409 naming the
-- first such run in the batch's order (by run id: the caller sorts them), with the count
-- of the others, as before. Rows are still locked in that order: the join reads the
-- batch's rows in document order and looks each run up by its key (below).
--
-- Plans: each keyed statement must stay a primary-key lookup per row of the batch
-- whatever the tables held when PL/pgSQL made its plan. A plan is cached per connection,
-- and after five calls a generic one is kept for the connection's life: planned against a
-- still empty table (a new store, or statistics not analysed yet), a join of the batch
-- with `runs` would be a hash join over a sequential scan, read whole on every commit
-- once the table holds millions of rows. The function turns hash joins, merge joins and
-- sequential scans off for its own statements (a SET on the function: the settings apply
-- to its plans only and are restored when it returns), so the only plan left for a join
-- with a table keyed by its primary key is a nested loop over the batch's rows with an
-- index lookup on each, whatever the statistics say. plan_cache_mode = force_custom_plan
-- would plan each call again (a cost on every commit) and still trust statistics that
-- can be stale; dynamic EXECUTE would re-plan too. Nothing in the function needs a hash
-- join or a scan: every statement is keyed by the batch's rows or by run ids.
CREATE OR REPLACE FUNCTION tideflow_commit(batch jsonb) RETURNS void LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    advanced text[];
    stale text[];
BEGIN
    IF batch ? 'runs' THEN
        WITH b AS (
            SELECT e->>0 AS run_id, e->>1 AS status, (e->>2)::float8 AS updated_at,
                   (e->>3)::float8 AS finished_at, e->>4 AS output, e->>5 AS error,
                   (e->>6)::bigint AS last_seq, (e->>7)::bigint AS expected_seq,
                   (e->>8)::bigint AS snapshot_seq, e->>9 AS snapshot
            FROM jsonb_array_elements(batch->'runs') AS e
        ), moved AS (
            UPDATE runs
            SET status = b.status, updated_at = b.updated_at, finished_at = b.finished_at,
                output = b.output, error = b.error, last_seq = b.last_seq,
                snapshot = CASE WHEN b.snapshot_seq IS NULL THEN runs.snapshot
                                ELSE b.snapshot END,
                snapshot_seq = coalesce(b.snapshot_seq, runs.snapshot_seq)
            FROM b
            WHERE runs.run_id = b.run_id AND runs.last_seq = b.expected_seq
            RETURNING runs.run_id
        )
        SELECT array_agg(run_id) INTO advanced FROM moved;
        IF coalesce(cardinality(advanced), 0) < jsonb_array_length(batch->'runs') THEN
            stale := ARRAY(
                SELECT e->>0 FROM jsonb_array_elements(batch->'runs') WITH ORDINALITY AS t(e, i)
                WHERE e->>0 <> ALL (coalesce(advanced, '{}')) ORDER BY i);
            RAISE EXCEPTION USING ERRCODE = 'TF409', MESSAGE = format(
                'run %s%s was advanced by another applier', stale[1],
                CASE WHEN cardinality(stale) > 1
                     THEN format(' (and %s more)', cardinality(stale) - 1) ELSE '' END);
        END IF;
    END IF;
    IF batch ? 'history' THEN
        INSERT INTO history (run_id, seq, event_id, kind, time, data, transitions)
        SELECT e->>0, (e->>1)::bigint, e->>2, e->>3, (e->>4)::float8, e->>5, e->>6
        FROM jsonb_array_elements(batch->'history') AS e;
    END IF;
    IF batch ? 'snapshots' THEN
        UPDATE runs SET snapshot = s.state, snapshot_seq = s.seq
        FROM (SELECT e->>0 AS run_id, (e->>1)::bigint AS seq, e->>2 AS state
              FROM jsonb_array_elements(batch->'snapshots') AS e) AS s
        WHERE runs.run_id = s.run_id;
    END IF;
    IF batch ? 'outbox' THEN
        INSERT INTO outbox (id, run_id, created_at, command)
        SELECT e->>0, e->>1, (e->>2)::float8, e->>3
        FROM jsonb_array_elements(batch->'outbox') AS e
        ON CONFLICT (id) DO NOTHING;
    END IF;
    IF batch ? 'relayed' THEN
        DELETE FROM outbox
        WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(batch->'relayed')));
    END IF;
    IF batch ? 'timers' THEN
        INSERT INTO timers (run_id, timer_id, fire_at)
        SELECT e->>0, e->>1, (e->>2)::float8
        FROM jsonb_array_elements(batch->'timers') AS e
        ON CONFLICT (run_id, timer_id) DO UPDATE SET fire_at = excluded.fire_at;
    END IF;
    IF batch ? 'untimed' THEN
        DELETE FROM timers
        USING (SELECT e->>0 AS run_id, e->>1 AS timer_id
               FROM jsonb_array_elements(batch->'untimed') AS e) AS u
        WHERE timers.run_id = u.run_id AND timers.timer_id = u.timer_id;
    END IF;
    IF batch ? 'done' THEN
        DELETE FROM task_leases
        USING (SELECT e->>0 AS run_id, e->>1 AS step_key, (e->>2)::int AS attempt
               FROM jsonb_array_elements(batch->'done') AS e) AS d
        WHERE task_leases.run_id = d.run_id AND task_leases.step_key = d.step_key
          AND task_leases.attempt = d.attempt;
    END IF;
    IF batch ? 'tasks' THEN
        INSERT INTO task_leases (run_id, step_key, attempt, dispatched_at, started_at, owner,
                                 lease_until)
        SELECT e->>0, e->>1, (e->>2)::int, (e->>3)::float8, (e->>4)::float8, NULL, 0
        FROM jsonb_array_elements(batch->'tasks') AS e
        ON CONFLICT (run_id, step_key) DO UPDATE SET
            attempt = excluded.attempt, dispatched_at = excluded.dispatched_at,
            started_at = excluded.started_at, owner = NULL, lease_until = 0;
    END IF;
    IF batch ? 'starts' THEN
        UPDATE task_leases SET started_at = s.started_at
        FROM (SELECT (e->>0)::float8 AS started_at, e->>1 AS run_id, e->>2 AS step_key,
                     (e->>3)::int AS attempt
              FROM jsonb_array_elements(batch->'starts') AS e) AS s
        WHERE task_leases.run_id = s.run_id AND task_leases.step_key = s.step_key
          AND task_leases.attempt = s.attempt;
    END IF;
    IF batch ? 'rewait' THEN
        DELETE FROM waits
        WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(batch->'rewait')));
        INSERT INTO waits (signal, run_id)
        SELECT e->>0, e->>1 FROM jsonb_array_elements(batch->'waits') AS e
        ON CONFLICT DO NOTHING;
    END IF;
    IF batch ? 'ended' THEN
        DELETE FROM timers
        WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(batch->'ended')));
        DELETE FROM task_leases
        WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(batch->'ended')));
        DELETE FROM waits
        WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(batch->'ended')));
    END IF;
END;
$$;
