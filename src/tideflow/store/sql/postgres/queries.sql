-- Named queries of the PostgreSQL store. Parameters are positional ($1, $2, …).
-- asyncpg prepares each statement once per connection and reuses it.
-- Text keys are COLLATE "C" in the schema, so they sort as in SQLite and in memory.

-- name: schema_version_table
SELECT to_regclass('schema_version') IS NOT NULL;

-- name: schema_version
SELECT max(version) FROM schema_version;

-- name: create_schema_version
CREATE TABLE IF NOT EXISTS schema_version (
    version     INTEGER PRIMARY KEY,
    applied_at  DOUBLE PRECISION NOT NULL
);

-- name: insert_schema_version
INSERT INTO schema_version (version, applied_at) VALUES ($1, $2);

-- name: migration_lock
-- One migrator per database schema at a time; released when the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('tideflow:migrate:' || $1::text));

-- name: schema_exists
SELECT 1 FROM pg_namespace WHERE nspname = $1;

-- name: insert_plan
INSERT INTO plans (hash, source) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING;

-- name: definition_hash
SELECT hash FROM definitions WHERE name = $1 AND version = $2;

-- name: insert_definition
INSERT INTO definitions (name, version, hash, created_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (name, version) DO NOTHING
RETURNING hash;

-- name: definition_versions
SELECT version, hash, active FROM definitions WHERE name = $1;

-- name: insert_trigger
INSERT INTO definition_triggers (event, name, version) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING;

-- name: triggered_by
SELECT d.name, d.version, d.hash, d.created_at, d.active, p.source::json ->> 'title'
FROM definition_triggers AS t
JOIN definitions AS d ON d.name = t.name AND d.version = t.version
JOIN plans AS p ON p.hash = d.hash
WHERE t.event = $1 AND d.active
ORDER BY d.name, d.version;

-- name: set_definition_active
UPDATE definitions SET active = $1 WHERE name = $2 AND version = $3;

-- name: definition_names
SELECT DISTINCT name FROM definitions ORDER BY name;

-- name: plan_source
SELECT p.source, d.name, d.version
FROM plans AS p LEFT JOIN definitions AS d ON d.hash = p.hash
WHERE p.hash = $1
ORDER BY d.created_at
LIMIT 1;

-- name: list_definitions
SELECT d.name, d.version, d.hash, d.created_at, d.active, p.source::json ->> 'title'
FROM definitions AS d JOIN plans AS p ON p.hash = d.hash
ORDER BY d.name, d.version;

-- name: insert_runs
-- Many new runs in one statement (Store.create_runs): one array per column.
INSERT INTO runs (run_id, workflow, version, plan_hash, status, created_at, updated_at,
                  parent_run_id, idempotency_key, last_seq, snapshot_seq, snapshot, priority)
SELECT r.run_id, r.workflow, r.version, r.plan_hash, r.status, r.created_at, r.updated_at,
       r.parent_run_id, r.idempotency_key, 0, 0, r.snapshot, r.priority
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
            $6::double precision[], $7::double precision[], $8::text[], $9::text[],
            $10::text[], $11::smallint[])
     AS r(run_id, workflow, version, plan_hash, status, created_at, updated_at,
          parent_run_id, idempotency_key, snapshot, priority)
ON CONFLICT DO NOTHING
RETURNING run_id;

-- name: runs_by_idempotency_keys
SELECT idempotency_key, run_id FROM runs WHERE idempotency_key = ANY($1::text[]);

-- name: load_run
-- One statement, so the snapshot and the events after it come from one consistent view.
SELECT r.snapshot, r.last_seq,
       ARRAY(SELECT h.seq FROM history AS h
             WHERE h.run_id = r.run_id AND h.seq > r.snapshot_seq ORDER BY h.seq) AS seqs,
       ARRAY(SELECT h.data FROM history AS h
             WHERE h.run_id = r.run_id AND h.seq > r.snapshot_seq ORDER BY h.seq) AS events
FROM runs AS r
WHERE r.run_id = $1;

-- name: delete_outbox
DELETE FROM outbox WHERE id = ANY($1::text[]);

-- name: pending_outbox
SELECT id, run_id, command FROM outbox ORDER BY created_at, id LIMIT $1;

-- name: history
SELECT seq, time, kind, data, transitions FROM history WHERE run_id = $1 ORDER BY seq;

-- name: run_exists
SELECT 1 FROM runs WHERE run_id = $1;

-- name: run_plan_hash
SELECT plan_hash FROM runs WHERE run_id = $1;

-- name: get_run
SELECT run_id, workflow, version, status, created_at, updated_at, finished_at, parent_run_id, output, error
FROM runs WHERE run_id = $1;

-- name: get_runs
SELECT run_id, workflow, version, status, created_at, updated_at, finished_at, parent_run_id, output, error
FROM runs WHERE run_id = ANY($1::text[]);

-- name: histories
SELECT run_id, seq, time, kind, data, transitions FROM history
WHERE run_id = ANY($1::text[])
ORDER BY run_id, seq;

-- name: unfinished_runs
SELECT run_id FROM runs
WHERE status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out', 'compensated', 'compensation_failed')
ORDER BY created_at;

-- name: prunable_runs
SELECT run_id FROM runs
WHERE finished_at IS NOT NULL AND finished_at < $1
  AND status IN ('succeeded', 'failed', 'cancelled', 'timed_out', 'compensated', 'compensation_failed')
ORDER BY finished_at LIMIT $2;

-- name: delete_history
DELETE FROM history WHERE run_id = ANY($1::text[]);

-- name: delete_run_outbox
DELETE FROM outbox WHERE run_id = ANY($1::text[]);

-- name: delete_runs
DELETE FROM runs WHERE run_id = ANY($1::text[]);

-- name: upsert_timers
INSERT INTO timers (run_id, timer_id, fire_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::float8[])
ON CONFLICT (run_id, timer_id) DO UPDATE SET fire_at = excluded.fire_at;

-- name: delete_timers
DELETE FROM timers AS t
USING unnest($1::text[], $2::text[]) AS d (run_id, timer_id)
WHERE t.run_id = d.run_id AND t.timer_id = d.timer_id;

-- name: due_timers
SELECT run_id, timer_id, fire_at FROM timers
WHERE fire_at > $1 AND fire_at <= $2
ORDER BY fire_at, run_id, timer_id LIMIT $3;

-- name: upsert_tasks
INSERT INTO task_leases (run_id, step_key, attempt, dispatched_at, started_at, owner, lease_until)
SELECT u.run_id, u.step_key, u.attempt, u.dispatched_at, u.started_at, NULL, 0
FROM unnest($1::text[], $2::text[], $3::int[], $4::float8[], $5::float8[])
     AS u (run_id, step_key, attempt, dispatched_at, started_at)
ON CONFLICT (run_id, step_key) DO UPDATE SET
    attempt = excluded.attempt, dispatched_at = excluded.dispatched_at,
    started_at = excluded.started_at, owner = NULL, lease_until = 0;

-- name: start_tasks
UPDATE task_leases AS t SET started_at = u.started_at
FROM unnest($1::float8[], $2::text[], $3::text[], $4::int[])
     AS u (started_at, run_id, step_key, attempt)
WHERE t.run_id = u.run_id AND t.step_key = u.step_key AND t.attempt = u.attempt;

-- name: delete_tasks
DELETE FROM task_leases AS t
USING unnest($1::text[], $2::text[], $3::int[]) AS d (run_id, step_key, attempt)
WHERE t.run_id = d.run_id AND t.step_key = d.step_key AND t.attempt = d.attempt;

-- name: claim_task
UPDATE task_leases SET owner = $1, lease_until = $2
WHERE run_id = $3 AND step_key = $4 AND attempt = $5
  AND (owner IS NULL OR owner = $1 OR lease_until <= $6)
RETURNING 1;

-- name: extend_task
UPDATE task_leases SET lease_until = $1
WHERE run_id = $2 AND step_key = $3 AND attempt = $4 AND owner = $5
RETURNING 1;

-- name: tasks_in_flight
SELECT run_id, step_key, attempt, dispatched_at, started_at, owner, lease_until
FROM task_leases WHERE attempt > 0 AND (run_id, step_key) > ($1, $2)
ORDER BY run_id, step_key LIMIT $3;

-- name: expired_tasks
SELECT run_id, step_key, attempt, dispatched_at, started_at, owner, lease_until
FROM task_leases WHERE lease_until < $1
ORDER BY lease_until, run_id, step_key LIMIT $2;

-- name: delete_runs_waits
DELETE FROM waits WHERE run_id = ANY($1::text[]);

-- name: insert_waits
INSERT INTO waits (signal, run_id)
SELECT * FROM unnest($1::text[], $2::text[])
ON CONFLICT DO NOTHING;

-- name: runs_waiting_for
SELECT run_id FROM waits WHERE signal = $1 ORDER BY run_id;

-- name: delete_runs_timers
DELETE FROM timers WHERE run_id = ANY($1::text[]);

-- name: delete_runs_tasks
DELETE FROM task_leases WHERE run_id = ANY($1::text[]);

-- name: unindexed_runs
SELECT run_id FROM unindexed_runs ORDER BY run_id LIMIT $1;

-- name: indexed_run
DELETE FROM unindexed_runs WHERE run_id = ANY($1::text[]);

-- name: acquire_lease
-- Taken when free, expired, already the caller's, or held by a holder known to be dead.
INSERT INTO engine_leases (name, owner, kind, host, pid, address, acquired_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (name) DO UPDATE SET
    owner = excluded.owner, kind = excluded.kind, host = excluded.host, pid = excluded.pid,
    address = excluded.address, acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at
WHERE engine_leases.expires_at <= $9 OR engine_leases.owner = excluded.owner
   OR engine_leases.owner = $10;

-- name: lease_holder
SELECT name, owner, kind, host, pid, address, acquired_at, expires_at
FROM engine_leases WHERE name = $1;

-- name: list_leases
-- A handful of rows (a cluster's members and partitions): no index needed.
SELECT name, owner, kind, host, pid, address, acquired_at, expires_at
FROM engine_leases WHERE starts_with(name, $1) ORDER BY name;

-- name: renew_leases
UPDATE engine_leases SET expires_at = $1 WHERE name = ANY($2::text[]) AND owner = $3
RETURNING name;

-- name: release_lease
DELETE FROM engine_leases WHERE name = $1 AND owner = $2;

-- name: insert_inbox
INSERT INTO inbox (event_id, run_id, created_at, event) VALUES ($1, $2, $3, $4)
ON CONFLICT (event_id) DO NOTHING;

-- name: notify_inbox
-- Delivered to the listening engine when the transaction that added the events commits.
SELECT pg_notify('tideflow_inbox:' || current_schema(), '');

-- name: inbox_channel
SELECT 'tideflow_inbox:' || current_schema();

-- name: inbox
SELECT event_id, run_id, event FROM inbox ORDER BY created_at, event_id LIMIT $1;

-- name: delete_inbox
DELETE FROM inbox WHERE event_id = ANY($1::text[]);

-- name: commit_batch
-- A whole batch in one statement (tideflow_commit, migration 0004): one round trip.
SELECT tideflow_commit($1::jsonb);

-- name: insert_token
INSERT INTO api_tokens (token_id, name, role, secret_hash, created_at, revoked_at, last_used_at)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (token_id) DO NOTHING RETURNING token_id;

-- name: get_token
SELECT token_id, name, role, secret_hash, created_at, revoked_at, last_used_at
FROM api_tokens WHERE token_id = $1;

-- name: list_tokens
SELECT token_id, name, role, secret_hash, created_at, revoked_at, last_used_at
FROM api_tokens ORDER BY created_at, token_id;

-- name: revoke_token
UPDATE api_tokens SET revoked_at = $1 WHERE token_id = $2 AND revoked_at IS NULL
RETURNING token_id;

-- name: record_token_use
UPDATE api_tokens SET last_used_at = $1
WHERE token_id = $2 AND (last_used_at IS NULL OR last_used_at < $1);

-- name: list_schedules
SELECT workflow, schedule_id, version, origin, spec, paused, deleted, next_slot, fire_at,
       last_slot, last_run_id, buffered_slot, revision, updated_at
FROM schedules WHERE $1::text IS NULL OR workflow = $1 ORDER BY workflow, schedule_id;

-- name: due_schedules
SELECT workflow, schedule_id, version, origin, spec, paused, deleted, next_slot, fire_at,
       last_slot, last_run_id, buffered_slot, revision, updated_at
FROM schedules
WHERE NOT paused AND NOT deleted AND fire_at IS NOT NULL AND fire_at > $1 AND fire_at <= $2
ORDER BY fire_at, workflow, schedule_id LIMIT $3;

-- name: insert_schedule
INSERT INTO schedules (workflow, schedule_id, version, origin, spec, paused, deleted,
                       next_slot, fire_at, last_slot, last_run_id, buffered_slot, revision,
                       updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 0, $13)
ON CONFLICT (workflow, schedule_id) DO NOTHING
RETURNING workflow;

-- name: update_schedule
UPDATE schedules SET version = $1, origin = $2, spec = $3, paused = $4, deleted = $5,
       next_slot = $6, fire_at = $7, last_slot = $8, last_run_id = $9, buffered_slot = $10,
       updated_at = $11, revision = revision + 1
WHERE workflow = $12 AND schedule_id = $13 AND revision = $14
RETURNING workflow;

-- name: remove_schedule
DELETE FROM schedules WHERE workflow = $1 AND schedule_id = $2 RETURNING workflow;

-- name: insert_gateway_event
INSERT INTO gateway_events (event_key, source, event_id, type, run_id, payload, status, received_at, buffer_until, delivered_to, started, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (event_key) DO NOTHING RETURNING event_key;

-- name: insert_gateway_event_rows
INSERT INTO gateway_event_rows (wait_row, event_key)
SELECT unnest($1::text[]), $2 ON CONFLICT DO NOTHING;

-- name: get_gateway_event
SELECT event_key, source, event_id, type, run_id, payload, status, received_at, buffer_until, delivered_to, started, reason FROM gateway_events WHERE event_key = $1;

-- name: settle_gateway_event
UPDATE gateway_events SET status = $1, delivered_to = $2, started = $3, reason = $4
WHERE event_key = $5 AND status = $6 RETURNING event_key;

-- name: buffered_gateway_events
SELECT e.event_key, e.source, e.event_id, e.type, e.run_id, e.payload, e.status, e.received_at,
       e.buffer_until, e.delivered_to, e.started, e.reason
FROM gateway_event_rows r JOIN gateway_events e ON e.event_key = r.event_key
WHERE r.wait_row = $1 AND e.status = 'buffered' AND e.buffer_until > $2
ORDER BY e.received_at, e.event_key;

-- name: count_buffered_events
SELECT count(*) FROM gateway_events WHERE status = 'buffered' AND buffer_until > $1;

-- name: count_buffered_under
SELECT count(*) FROM gateway_event_rows r JOIN gateway_events e ON e.event_key = r.event_key
WHERE r.wait_row = $1 AND e.status = 'buffered' AND e.buffer_until > $2;

-- name: unmatched_gateway_events
SELECT event_key, source, event_id, type, run_id, payload, status, received_at, buffer_until, delivered_to, started, reason FROM gateway_events
WHERE (status = 'unmatched'
       OR (status = 'buffered' AND buffer_until <= $1 AND delivered_to = '[]'))
  AND ($2::text IS NULL OR event_key > $2)
ORDER BY event_key LIMIT $3;

-- name: prune_gateway_event_rows
DELETE FROM gateway_event_rows WHERE event_key IN
    (SELECT event_key FROM gateway_events WHERE buffer_until < $1);

-- name: prune_gateway_events
DELETE FROM gateway_events WHERE buffer_until < $1;

-- name: buffered_for_waits
SELECT w.run_id, w.signal, e.event_key, e.source, e.event_id, e.type, e.run_id, e.payload, e.status, e.received_at,
       e.buffer_until, e.delivered_to, e.started, e.reason
FROM gateway_events e
JOIN gateway_event_rows r ON r.event_key = e.event_key
JOIN waits w ON w.signal = r.wait_row
WHERE e.status = 'buffered' AND e.buffer_until > $1
ORDER BY e.received_at, e.event_key, w.run_id LIMIT $2;

-- name: pending_runs
-- The admission queue from after (priority, created_at, run_id), in order (runs_pending).
SELECT run_id, priority, created_at FROM runs
WHERE status = 'pending' AND (priority, created_at, run_id) > ($1, $2, $3)
ORDER BY priority, created_at, run_id
LIMIT $4;

-- name: count_pending
SELECT count(*) FROM runs WHERE status = 'pending';

-- name: count_pending_ahead
-- The pending runs ahead of run $1 in the admission queue (runs_pending).
SELECT count(*) FROM runs AS r, runs AS k
WHERE k.run_id = $1 AND r.status = 'pending'
  AND (r.priority, r.created_at, r.run_id) < (k.priority, k.created_at, k.run_id);
