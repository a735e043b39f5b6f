-- tideflow schema version 4 (PostgreSQL): a commit is one statement, one round trip.
-- tideflow_commit writes a whole batch, given as one JSON document of row lists (built by
-- store/backends/postgres_rows.py, commit_document): it advances the batch's runs (each
-- only if its last_seq is still what the applier loaded, locked in the order given: the
-- caller sorts them by run id), appends their history, saves snapshots, adds and deletes
-- outbox rows, and keeps the timer, task and wait rows current (store/indexrows.py).
-- Called alone, in an implicit transaction: it all commits or none of it does. A stale run
-- raises SQLSTATE TF409 naming the first stale run (the caller raises ConcurrencyConflict).
-- A key is left out when the batch has no row of its kind.
--
-- A run's row is rewritten by every commit that advances it: keep it thin (its snapshot,
-- a few kB of JSON, goes to the TOAST table, so an update copies a pointer to it) and
-- leave room on each page, so that the rewrite stays on its page and, as no indexed
-- column changes, adds no index entries (a HOT update). Rows written before keep their
-- layout until they are next rewritten.
ALTER TABLE runs SET (fillfactor = 70, toast_tuple_target = 128);

-- Every keyed UPDATE and DELETE is a primary-key lookup, row by row: its cached plan is
-- an index scan whatever the table held when the plan was made (a join with the batch
-- planned against a still empty table stays a sequential scan for the connection's life).
CREATE FUNCTION tideflow_commit(batch jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r record;
    stale text[] := '{}';
BEGIN
    IF batch ? 'runs' THEN
        FOR r IN
            SELECT e->>0 AS run_id, e->>1 AS status, (e->>2)::float8 AS updated_at,
                   (e->>3)::float8 AS finished_at, e->>4 AS output, e->>5 AS error,
                   (e->>6)::bigint AS last_seq, (e->>7)::bigint AS expected_seq
            FROM jsonb_array_elements(batch->'runs') AS e
        LOOP
            UPDATE runs
            SET status = r.status, updated_at = r.updated_at, finished_at = r.finished_at,
                output = r.output, error = r.error, last_seq = r.last_seq
            WHERE run_id = r.run_id AND last_seq = r.expected_seq;
            IF NOT FOUND THEN
                stale := stale || r.run_id;
            END IF;
        END LOOP;
        IF cardinality(stale) > 0 THEN
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
        FOR r IN
            SELECT e->>0 AS run_id, (e->>1)::bigint AS seq, e->>2 AS state
            FROM jsonb_array_elements(batch->'snapshots') AS e
        LOOP
            UPDATE runs SET snapshot = r.state, snapshot_seq = r.seq WHERE run_id = r.run_id;
        END LOOP;
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
        FOR r IN
            SELECT e->>0 AS run_id, e->>1 AS timer_id
            FROM jsonb_array_elements(batch->'untimed') AS e
        LOOP
            DELETE FROM timers WHERE run_id = r.run_id AND timer_id = r.timer_id;
        END LOOP;
    END IF;
    IF batch ? 'done' THEN
        FOR r IN
            SELECT e->>0 AS run_id, e->>1 AS step_key, (e->>2)::int AS attempt
            FROM jsonb_array_elements(batch->'done') AS e
        LOOP
            DELETE FROM task_leases
            WHERE run_id = r.run_id AND step_key = r.step_key AND attempt = r.attempt;
        END LOOP;
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
        FOR r IN
            SELECT (e->>0)::float8 AS started_at, e->>1 AS run_id, e->>2 AS step_key,
                   (e->>3)::int AS attempt
            FROM jsonb_array_elements(batch->'starts') AS e
        LOOP
            UPDATE task_leases SET started_at = r.started_at
            WHERE run_id = r.run_id AND step_key = r.step_key AND attempt = r.attempt;
        END LOOP;
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
