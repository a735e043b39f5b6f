-- tideflow schema version 4 (PostgreSQL): a commit is one statement, one round trip.
-- tideflow_commit writes a whole batch: it advances the batch's runs (each only if its
-- last_seq is still what the applier loaded, locked in the order given: the caller sorts
-- them by run id), appends their history, saves snapshots, adds and deletes outbox rows,
-- and keeps the timer, task and wait rows current (store/indexrows.py). Called alone, in
-- an implicit transaction: it all commits or none of it does. A stale run raises SQLSTATE
-- TF409 naming the first stale run (the caller raises ConcurrencyConflict with it).
-- An argument left NULL means "nothing of that kind in this batch".
CREATE FUNCTION tideflow_commit(
    run_ids text[], run_status text[], run_updated float8[], run_finished float8[],
    run_output text[], run_error text[], run_last bigint[], run_expected bigint[],
    h_run text[], h_seq bigint[], h_event text[], h_kind text[], h_time float8[],
    h_data text[], h_transitions text[],
    snap_run text[], snap_seq bigint[], snap_state text[],
    out_id text[], out_run text[], out_created float8[], out_command text[],
    relayed text[],
    timer_run text[], timer_key text[], timer_fire float8[],
    untimer_run text[], untimer_key text[],
    done_run text[], done_key text[], done_attempt int[],
    task_run text[], task_key text[], task_attempt int[], task_dispatched float8[],
    task_started float8[],
    start_at float8[], start_run text[], start_key text[], start_attempt int[],
    rewait_runs text[], wait_signal text[], wait_run text[],
    ended text[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    i int;
    stale text[] := '{}';
BEGIN
    -- Row by row by primary key, in the order given (sorted by run id: the lock order).
    -- Every keyed UPDATE and DELETE here is a primary-key lookup, so its cached plan is
    -- an index scan whatever the table held when the plan was made (a join with unnest()
    -- planned against a still empty table becomes a sequential scan for good).
    FOR i IN 1 .. coalesce(cardinality(run_ids), 0) LOOP
        UPDATE runs
        SET status = run_status[i], updated_at = run_updated[i], finished_at = run_finished[i],
            output = run_output[i], error = run_error[i], last_seq = run_last[i]
        WHERE run_id = run_ids[i] AND last_seq = run_expected[i];
        IF NOT FOUND THEN
            stale := stale || run_ids[i];
        END IF;
    END LOOP;
    IF cardinality(stale) > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'TF409', MESSAGE = format(
            'run %s%s was advanced by another applier', stale[1],
            CASE WHEN cardinality(stale) > 1
                 THEN format(' (and %s more)', cardinality(stale) - 1) ELSE '' END);
    END IF;
    IF h_run IS NOT NULL THEN
        INSERT INTO history (run_id, seq, event_id, kind, time, data, transitions)
        SELECT * FROM unnest(h_run, h_seq, h_event, h_kind, h_time, h_data, h_transitions);
    END IF;
    FOR i IN 1 .. coalesce(cardinality(snap_run), 0) LOOP
        UPDATE runs SET snapshot = snap_state[i], snapshot_seq = snap_seq[i]
        WHERE run_id = snap_run[i];
    END LOOP;
    IF out_id IS NOT NULL THEN
        INSERT INTO outbox (id, run_id, created_at, command)
        SELECT * FROM unnest(out_id, out_run, out_created, out_command)
        ON CONFLICT (id) DO NOTHING;
    END IF;
    IF relayed IS NOT NULL THEN
        DELETE FROM outbox WHERE id = ANY (relayed);
    END IF;
    IF timer_run IS NOT NULL THEN
        INSERT INTO timers (run_id, timer_id, fire_at)
        SELECT * FROM unnest(timer_run, timer_key, timer_fire)
        ON CONFLICT (run_id, timer_id) DO UPDATE SET fire_at = excluded.fire_at;
    END IF;
    FOR i IN 1 .. coalesce(cardinality(untimer_run), 0) LOOP
        DELETE FROM timers WHERE run_id = untimer_run[i] AND timer_id = untimer_key[i];
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(done_run), 0) LOOP
        DELETE FROM task_leases
        WHERE run_id = done_run[i] AND step_key = done_key[i] AND attempt = done_attempt[i];
    END LOOP;
    IF task_run IS NOT NULL THEN
        INSERT INTO task_leases (run_id, step_key, attempt, dispatched_at, started_at, owner,
                                 lease_until)
        SELECT u.run_id, u.step_key, u.attempt, u.dispatched_at, u.started_at, NULL, 0
        FROM unnest(task_run, task_key, task_attempt, task_dispatched, task_started)
             AS u (run_id, step_key, attempt, dispatched_at, started_at)
        ON CONFLICT (run_id, step_key) DO UPDATE SET
            attempt = excluded.attempt, dispatched_at = excluded.dispatched_at,
            started_at = excluded.started_at, owner = NULL, lease_until = 0;
    END IF;
    FOR i IN 1 .. coalesce(cardinality(start_run), 0) LOOP
        UPDATE task_leases SET started_at = start_at[i]
        WHERE run_id = start_run[i] AND step_key = start_key[i] AND attempt = start_attempt[i];
    END LOOP;
    IF rewait_runs IS NOT NULL THEN
        DELETE FROM waits WHERE run_id = ANY (rewait_runs);
        IF wait_run IS NOT NULL THEN
            INSERT INTO waits (signal, run_id)
            SELECT * FROM unnest(wait_signal, wait_run)
            ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    IF ended IS NOT NULL THEN
        DELETE FROM timers WHERE run_id = ANY (ended);
        DELETE FROM task_leases WHERE run_id = ANY (ended);
        DELETE FROM waits WHERE run_id = ANY (ended);
    END IF;
END;
$$;
