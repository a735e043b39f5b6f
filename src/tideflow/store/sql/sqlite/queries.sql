-- Named queries of the SQLite store. Parameters are positional (?).

-- name: schema_version
SELECT max(version) FROM schema_version;

-- name: insert_plan
INSERT INTO plans (hash, source) VALUES (?, ?) ON CONFLICT (hash) DO NOTHING;

-- name: definition_hash
SELECT hash FROM definitions WHERE name = ? AND version = ?;

-- name: insert_definition
INSERT INTO definitions (name, version, hash, created_at) VALUES (?, ?, ?, ?);

-- name: definition_versions
SELECT version, hash, active FROM definitions WHERE name = ?;

-- name: insert_trigger
INSERT INTO definition_triggers (event, name, version) VALUES (?, ?, ?)
ON CONFLICT DO NOTHING;

-- name: triggered_by
SELECT d.name, d.version, d.hash, d.created_at, d.active, json_extract(p.source, '$.title')
FROM definition_triggers AS t
JOIN definitions AS d ON d.name = t.name AND d.version = t.version
JOIN plans AS p ON p.hash = d.hash
WHERE t.event = ? AND d.active
ORDER BY d.name, d.version;

-- name: set_definition_active
UPDATE definitions SET active = ? WHERE name = ? AND version = ?;

-- name: plan_source
SELECT p.source, d.name, d.version
FROM plans AS p LEFT JOIN definitions AS d ON d.hash = p.hash
WHERE p.hash = ?
ORDER BY d.created_at
LIMIT 1;

-- name: list_definitions
SELECT d.name, d.version, d.hash, d.created_at, d.active, json_extract(p.source, '$.title')
FROM definitions AS d JOIN plans AS p ON p.hash = d.hash
ORDER BY d.name, d.version;

-- name: insert_run
INSERT INTO runs (run_id, workflow, version, plan_hash, status, created_at, updated_at,
                  parent_run_id, idempotency_key, last_seq, snapshot_seq, snapshot, priority)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?, ?)
ON CONFLICT DO NOTHING;

-- name: run_by_idempotency_key
SELECT run_id FROM runs WHERE idempotency_key = ?;

-- name: load_run
SELECT snapshot, snapshot_seq, last_seq FROM runs WHERE run_id = ?;

-- name: history_after
SELECT seq, data FROM history WHERE run_id = ? AND seq > ? ORDER BY seq;

-- name: insert_history
INSERT INTO history (run_id, seq, event_id, kind, time, data, transitions) VALUES (?, ?, ?, ?, ?, ?, ?);

-- name: advance_run
UPDATE runs SET status = ?, updated_at = ?, finished_at = ?, output = ?, error = ?, last_seq = ?
WHERE run_id = ? AND last_seq = ?;

-- name: advance_run_in_place
-- advance_run for a batch that did not change the run's status (or finished_at): SQLite
-- rewrites the index entries of every column an UPDATE sets, changed or not, and leaving
-- status out spares the runs_status_created page in most commits.
UPDATE runs SET updated_at = ?, output = ?, error = ?, last_seq = ?
WHERE run_id = ? AND last_seq = ?;

-- name: save_snapshot
UPDATE runs SET snapshot = ?, snapshot_seq = ? WHERE run_id = ?;

-- name: insert_outbox
INSERT INTO outbox (id, run_id, created_at, command) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO NOTHING;

-- name: delete_outbox
DELETE FROM outbox WHERE id = ?;

-- name: pending_outbox
SELECT id, run_id, command FROM outbox ORDER BY created_at, id LIMIT ?;

-- name: history
SELECT seq, time, kind, data, transitions FROM history WHERE run_id = ? ORDER BY seq;

-- name: run_plan_hash
SELECT plan_hash FROM runs WHERE run_id = ?;

-- name: get_run
SELECT run_id, workflow, version, status, created_at, updated_at, finished_at, parent_run_id, output, error
FROM runs WHERE run_id = ?;

-- name: unfinished_runs
SELECT run_id FROM runs
WHERE status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out', 'compensated', 'compensation_failed')
ORDER BY created_at;

-- name: prunable_runs
SELECT run_id FROM runs
WHERE finished_at IS NOT NULL AND finished_at < ?
  AND status IN ('succeeded', 'failed', 'cancelled', 'timed_out', 'compensated', 'compensation_failed')
ORDER BY finished_at LIMIT ?;

-- name: delete_history
DELETE FROM history WHERE run_id = ?;

-- name: delete_run_outbox
DELETE FROM outbox WHERE run_id = ?;

-- name: delete_run
DELETE FROM runs WHERE run_id = ?;

-- name: upsert_timer
INSERT INTO timers (run_id, timer_id, fire_at) VALUES (?, ?, ?)
ON CONFLICT (run_id, timer_id) DO UPDATE SET fire_at = excluded.fire_at;

-- name: delete_timer
DELETE FROM timers WHERE run_id = ? AND timer_id = ?;

-- name: due_timers
SELECT run_id, timer_id, fire_at FROM timers
WHERE fire_at > ? AND fire_at <= ?
ORDER BY fire_at, run_id, timer_id LIMIT ?;

-- name: upsert_task
INSERT INTO task_leases (run_id, step_key, attempt, dispatched_at, started_at, owner, lease_until)
VALUES (?, ?, ?, ?, ?, NULL, 0)
ON CONFLICT (run_id, step_key) DO UPDATE SET
    attempt = excluded.attempt, dispatched_at = excluded.dispatched_at,
    started_at = excluded.started_at, owner = NULL, lease_until = 0;

-- name: start_task
UPDATE task_leases SET started_at = ? WHERE run_id = ? AND step_key = ? AND attempt = ?;

-- name: delete_task
DELETE FROM task_leases WHERE run_id = ? AND step_key = ? AND attempt = ?;

-- name: claim_task
UPDATE task_leases SET owner = ?, lease_until = ?
WHERE run_id = ? AND step_key = ? AND attempt = ?
  AND (owner IS NULL OR owner = ? OR lease_until <= ?);

-- name: extend_task
UPDATE task_leases SET lease_until = ?
WHERE run_id = ? AND step_key = ? AND attempt = ? AND owner = ?;

-- name: tasks_in_flight
SELECT run_id, step_key, attempt, dispatched_at, started_at, owner, lease_until
FROM task_leases WHERE attempt > 0 AND (run_id, step_key) > (?, ?)
ORDER BY run_id, step_key LIMIT ?;

-- name: expired_tasks
SELECT run_id, step_key, attempt, dispatched_at, started_at, owner, lease_until
FROM task_leases WHERE lease_until < ?
ORDER BY lease_until, run_id, step_key LIMIT ?;

-- name: delete_run_waits
DELETE FROM waits WHERE run_id = ?;

-- name: insert_wait
INSERT INTO waits (signal, run_id) VALUES (?, ?) ON CONFLICT DO NOTHING;

-- name: runs_waiting_for
SELECT run_id FROM waits WHERE signal = ? ORDER BY run_id;

-- name: delete_run_timers
DELETE FROM timers WHERE run_id = ?;

-- name: delete_run_tasks
DELETE FROM task_leases WHERE run_id = ?;

-- name: unindexed_runs
SELECT run_id FROM unindexed_runs ORDER BY run_id LIMIT ?;

-- name: indexed_run
DELETE FROM unindexed_runs WHERE run_id = ?;

-- name: acquire_lease
-- Taken when free, expired, already the caller's, or held by a holder known to be dead.
INSERT INTO engine_leases (name, owner, kind, host, pid, address, acquired_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (name) DO UPDATE SET
    owner = excluded.owner, kind = excluded.kind, host = excluded.host, pid = excluded.pid,
    address = excluded.address, acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at
WHERE engine_leases.expires_at <= ? OR engine_leases.owner = excluded.owner
   OR engine_leases.owner = ?;

-- name: lease_holder
SELECT name, owner, kind, host, pid, address, acquired_at, expires_at
FROM engine_leases WHERE name = ?;

-- name: list_leases
-- A handful of rows (a cluster's members and partitions): no index needed.
SELECT name, owner, kind, host, pid, address, acquired_at, expires_at
FROM engine_leases WHERE substr(name, 1, length(?)) = ? ORDER BY name;

-- name: renew_lease
UPDATE engine_leases SET expires_at = ? WHERE name = ? AND owner = ?;

-- name: release_lease
DELETE FROM engine_leases WHERE name = ? AND owner = ?;

-- name: insert_inbox
INSERT INTO inbox (event_id, run_id, created_at, event) VALUES (?, ?, ?, ?)
ON CONFLICT (event_id) DO NOTHING;

-- name: inbox
SELECT event_id, run_id, event FROM inbox ORDER BY created_at, event_id LIMIT ?;

-- name: delete_inbox
DELETE FROM inbox WHERE event_id = ?;

-- name: insert_token
INSERT INTO api_tokens (token_id, name, role, secret_hash, created_at, revoked_at, last_used_at)
VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (token_id) DO NOTHING;

-- name: get_token
SELECT token_id, name, role, secret_hash, created_at, revoked_at, last_used_at
FROM api_tokens WHERE token_id = ?;

-- name: list_tokens
SELECT token_id, name, role, secret_hash, created_at, revoked_at, last_used_at
FROM api_tokens ORDER BY created_at, token_id;

-- name: revoke_token
UPDATE api_tokens SET revoked_at = ? WHERE token_id = ? AND revoked_at IS NULL;

-- name: record_token_use
UPDATE api_tokens SET last_used_at = ?
WHERE token_id = ? AND (last_used_at IS NULL OR last_used_at < ?);

-- name: list_schedules
SELECT workflow, schedule_id, version, origin, spec, paused, deleted, next_slot, fire_at,
       last_slot, last_run_id, buffered_slot, revision, updated_at
FROM schedules WHERE ? IS NULL OR workflow = ? ORDER BY workflow, schedule_id;

-- name: due_schedules
SELECT workflow, schedule_id, version, origin, spec, paused, deleted, next_slot, fire_at,
       last_slot, last_run_id, buffered_slot, revision, updated_at
FROM schedules
WHERE paused = 0 AND deleted = 0 AND fire_at IS NOT NULL AND fire_at > ? AND fire_at <= ?
ORDER BY fire_at, workflow, schedule_id LIMIT ?;

-- name: insert_schedule
INSERT INTO schedules (workflow, schedule_id, version, origin, spec, paused, deleted,
                       next_slot, fire_at, last_slot, last_run_id, buffered_slot, revision,
                       updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)
ON CONFLICT (workflow, schedule_id) DO NOTHING;

-- name: update_schedule
UPDATE schedules SET version = ?, origin = ?, spec = ?, paused = ?, deleted = ?,
       next_slot = ?, fire_at = ?, last_slot = ?, last_run_id = ?, buffered_slot = ?,
       updated_at = ?, revision = revision + 1
WHERE workflow = ? AND schedule_id = ? AND revision = ?;

-- name: remove_schedule
DELETE FROM schedules WHERE workflow = ? AND schedule_id = ?;

-- name: insert_gateway_event
INSERT INTO gateway_events (event_key, source, event_id, type, run_id, payload, status, received_at, buffer_until, delivered_to, started, reason)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_key) DO NOTHING;

-- name: insert_gateway_event_row
INSERT INTO gateway_event_rows (wait_row, event_key) VALUES (?, ?) ON CONFLICT DO NOTHING;

-- name: get_gateway_event
SELECT event_key, source, event_id, type, run_id, payload, status, received_at, buffer_until, delivered_to, started, reason FROM gateway_events WHERE event_key = ?;

-- name: settle_gateway_event
UPDATE gateway_events SET status = ?, delivered_to = ?, started = ?, reason = ?
WHERE event_key = ? AND status = ?;

-- name: buffered_gateway_events
SELECT e.event_key, e.source, e.event_id, e.type, e.run_id, e.payload, e.status, e.received_at,
       e.buffer_until, e.delivered_to, e.started, e.reason
FROM gateway_event_rows r JOIN gateway_events e ON e.event_key = r.event_key
WHERE r.wait_row = ? AND e.status = 'buffered' AND e.buffer_until > ?
ORDER BY e.received_at, e.event_key;

-- name: count_buffered_events
SELECT count(*) FROM gateway_events WHERE status = 'buffered' AND buffer_until > ?;

-- name: count_buffered_under
SELECT count(*) FROM gateway_event_rows r JOIN gateway_events e ON e.event_key = r.event_key
WHERE r.wait_row = ? AND e.status = 'buffered' AND e.buffer_until > ?;

-- name: unmatched_gateway_events
SELECT event_key, source, event_id, type, run_id, payload, status, received_at, buffer_until, delivered_to, started, reason FROM gateway_events
WHERE (status = 'unmatched'
       OR (status = 'buffered' AND buffer_until <= ? AND delivered_to = '[]'))
  AND (? IS NULL OR event_key > ?)
ORDER BY event_key LIMIT ?;

-- name: prune_gateway_event_rows
DELETE FROM gateway_event_rows WHERE event_key IN
    (SELECT event_key FROM gateway_events WHERE buffer_until < ?);

-- name: prune_gateway_events
DELETE FROM gateway_events WHERE buffer_until < ?;

-- name: buffered_for_waits
SELECT w.run_id, w.signal, e.event_key, e.source, e.event_id, e.type, e.run_id, e.payload, e.status, e.received_at,
       e.buffer_until, e.delivered_to, e.started, e.reason
FROM gateway_events e
JOIN gateway_event_rows r ON r.event_key = e.event_key
JOIN waits w ON w.signal = r.wait_row
WHERE e.status = 'buffered' AND e.buffer_until > ?
ORDER BY e.received_at, e.event_key, w.run_id LIMIT ?;

-- name: pending_runs
-- The admission queue from after (priority, created_at, run_id), in order (runs_pending).
SELECT run_id, priority, created_at FROM runs
WHERE status = 'pending' AND (priority, created_at, run_id) > (?, ?, ?)
ORDER BY priority, created_at, run_id
LIMIT ?;

-- name: count_pending
SELECT count(*) FROM runs WHERE status = 'pending';

-- name: count_pending_ahead
-- The pending runs ahead of run ? in the admission queue (runs_pending).
SELECT count(*) FROM runs AS r, runs AS k
WHERE k.run_id = ? AND r.status = 'pending'
  AND (r.priority, r.created_at, r.run_id) < (k.priority, k.created_at, k.run_id);
