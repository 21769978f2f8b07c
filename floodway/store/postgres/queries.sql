-- Named queries of the PostgreSQL store. Each block starts with "-- name: NAME"; the names
-- match the SQLite store's wherever the verb exists there (a contract test checks it).
-- Times are parameters (the engine's clock), never the database's. Parameters that may be
-- NULL carry a cast, because PostgreSQL cannot infer the type of an untyped NULL.

-- name: insert_task
INSERT INTO tasks (id, kind, status, lane, lane_rank, tenant, input, max_attempts,
                   idempotency_key, fingerprint, cost_estimated, created_at, updated_at,
                   deadline_at, next_attempt_at, metadata, callback_url, batch_id)
VALUES (%(id)s, %(kind)s, 'queued', %(lane)s, %(lane_rank)s, %(tenant)s, %(input)s,
        %(max_attempts)s, %(idempotency_key)s::text, %(fingerprint)s::text, %(cost_estimated)s,
        %(now)s, %(now)s, %(deadline_at)s::double precision, %(now)s, %(metadata)s,
        %(callback_url)s::text, %(batch_id)s::text)
RETURNING *;

-- name: get_task
SELECT * FROM tasks WHERE id = %(id)s;

-- Lock the row first, so a cancel or a manual retry sees the status it is about to replace.
-- name: lock_task
SELECT * FROM tasks WHERE id = %(id)s FOR UPDATE;

-- name: get_request_key
SELECT task_id, request_hash, expires_at FROM request_keys
WHERE tenant = %(tenant)s AND key = %(key)s;

-- Reserve the key before the task exists: a concurrent submitter with the same key waits on
-- this row (ON CONFLICT) and then reuses our task instead of creating a second one.
-- name: reserve_request_key
INSERT INTO request_keys (tenant, key, task_id, request_hash, expires_at)
VALUES (%(tenant)s, %(key)s, %(task_id)s, %(request_hash)s, %(expires_at)s)
ON CONFLICT (tenant, key) DO NOTHING;

-- name: lock_request_key
SELECT task_id, request_hash, expires_at FROM request_keys
WHERE tenant = %(tenant)s AND key = %(key)s FOR UPDATE;

-- name: put_request_key
INSERT INTO request_keys (tenant, key, task_id, request_hash, expires_at)
VALUES (%(tenant)s, %(key)s, %(task_id)s, %(request_hash)s, %(expires_at)s)
ON CONFLICT (tenant, key) DO UPDATE SET task_id = excluded.task_id,
    request_hash = excluded.request_hash, expires_at = excluded.expires_at;

-- Serializes depth check + insert per tenant (transaction-scoped; the first key is a constant
-- that keeps floodway's advisory locks apart from anyone else's).
-- name: lock_tenant_depth
SELECT pg_advisory_xact_lock(1718382447, hashtext(%(tenant)s));

-- name: count_interactive
SELECT count(*) AS depth FROM tasks
WHERE tenant = %(tenant)s AND lane = 'interactive' AND status IN ('queued', 'running', 'retrying');

-- name: claim_fingerprint
INSERT INTO fingerprints (fingerprint, task_id, state, updated_at)
VALUES (%(fingerprint)s, %(task_id)s, 'inflight', %(now)s)
ON CONFLICT (fingerprint) DO NOTHING;

-- name: get_fingerprint
SELECT task_id, state FROM fingerprints WHERE fingerprint = %(fingerprint)s;

-- The owner's row lock: a new submitter holds it while it decides to wait, an ending owner
-- while it resolves or promotes its waiters, so neither misses the other.
-- name: lock_fingerprint
SELECT task_id, state FROM fingerprints WHERE fingerprint = %(fingerprint)s FOR UPDATE;

-- name: fingerprint_succeeded
UPDATE fingerprints SET state = 'succeeded', updated_at = %(now)s
WHERE fingerprint = %(fingerprint)s AND task_id = %(task_id)s;

-- name: fingerprint_handover
UPDATE fingerprints SET task_id = %(new_task_id)s, updated_at = %(now)s
WHERE fingerprint = %(fingerprint)s AND task_id = %(task_id)s;

-- name: fingerprint_drop
DELETE FROM fingerprints WHERE fingerprint = %(fingerprint)s AND task_id = %(task_id)s;

-- name: mark_deduped
UPDATE tasks SET status = 'deduped', duplicate_of = %(duplicate_of)s, waits_for = NULL,
    result = %(result)s::text, finished_at = %(now)s, updated_at = %(now)s,
    callback_state = CASE WHEN callback_url IS NOT NULL THEN 'pending' ELSE callback_state END,
    callback_next_at = CASE WHEN callback_url IS NOT NULL THEN %(now)s
                            ELSE callback_next_at END
WHERE id = %(id)s AND status = 'queued'
RETURNING id, tenant;

-- name: wait_for
UPDATE tasks SET waits_for = %(waits_for)s, duplicate_of = %(waits_for)s WHERE id = %(id)s;

-- name: resolve_waiters
UPDATE tasks SET status = 'deduped', duplicate_of = %(duplicate_of)s, waits_for = NULL,
    result = %(result)s::text, finished_at = %(now)s, updated_at = %(now)s,
    callback_state = CASE WHEN callback_url IS NOT NULL THEN 'pending' ELSE callback_state END,
    callback_next_at = CASE WHEN callback_url IS NOT NULL THEN %(now)s
                            ELSE callback_next_at END
WHERE waits_for = %(waits_for)s AND status = 'queued'
RETURNING id, tenant;

-- Locked, so a concurrent cancel of the heir cannot slip between choosing and promoting it.
-- name: first_waiter
SELECT id FROM tasks WHERE waits_for = %(waits_for)s AND status = 'queued'
ORDER BY seq LIMIT 1 FOR UPDATE;

-- name: promote_waiter
UPDATE tasks SET waits_for = NULL, duplicate_of = NULL, next_attempt_at = %(now)s,
    updated_at = %(now)s
WHERE id = %(id)s;

-- name: repoint_waiters
UPDATE tasks SET waits_for = %(new_task_id)s, duplicate_of = %(new_task_id)s
WHERE waits_for = %(waits_for)s AND status = 'queued';

-- name: insert_event
INSERT INTO task_events (task_id, status, at, attempt, detail)
VALUES (%(task_id)s, %(status)s, %(at)s, %(attempt)s, %(detail)s);

-- name: list_events
SELECT seq, task_id, status, at, attempt, detail FROM task_events
WHERE task_id = %(task_id)s AND seq > %(after_seq)s ORDER BY seq;

-- name: ready
-- Up to the limit of ready tasks of EACH tenant with work, so admission control can take turns.
-- The recursive part is a skip-scan over tasks_ready_tenant (one index probe per tenant);
-- the lateral part reads each tenant's queue in dispatch order along the same index.
WITH RECURSIVE tenants(name) AS (
    SELECT min(tenant) FROM tasks
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL
    UNION ALL
    SELECT (SELECT min(tenant) FROM tasks
            WHERE status IN ('queued', 'retrying') AND waits_for IS NULL
              AND tenant > tenants.name)
    FROM tenants WHERE tenants.name IS NOT NULL
)
SELECT t.id, t.kind, t.tenant, t.lane, t.cost_estimated, t.seq, t.created_at, t.deadline_at
FROM tenants CROSS JOIN LATERAL (
    SELECT y.* FROM tasks y
    WHERE y.tenant = tenants.name AND y.status IN ('queued', 'retrying')
      AND y.waits_for IS NULL AND y.next_attempt_at <= %(now)s
      AND y.kind = ANY(%(kinds)s::text[])
    ORDER BY y.lane_rank, y.seq
    LIMIT %(limit)s) AS t
ORDER BY t.lane_rank, t.seq;

-- One statement: pick in dispatch order along tasks_ready, skipping rows another claimer
-- holds, and move them to running. MATERIALIZED runs the pick exactly once, so LIMIT bounds
-- the rows updated whatever plan the outer UPDATE gets.
-- name: claim_next
WITH picked AS MATERIALIZED (
    SELECT seq FROM tasks
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL
      AND next_attempt_at <= %(now)s AND kind = ANY(%(kinds)s::text[])
    ORDER BY lane_rank, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
UPDATE tasks SET status = 'running', attempts = attempts + 1, lease_owner = %(owner)s,
    lease_token = %(token)s, lease_expires_at = %(expires_at)s,
    started_at = COALESCE(started_at, %(now)s), updated_at = %(now)s
WHERE seq IN (SELECT seq FROM picked)
RETURNING *;

-- A row another claimer is moving is waited for and then re-checked, so it is taken once.
-- name: claim_ids
UPDATE tasks SET status = 'running', attempts = attempts + 1, lease_owner = %(owner)s,
    lease_token = %(token)s, lease_expires_at = %(expires_at)s,
    started_at = COALESCE(started_at, %(now)s), updated_at = %(now)s
WHERE id = ANY(%(ids)s::text[])
  AND status IN ('queued', 'retrying') AND waits_for IS NULL
RETURNING *;

-- name: complete
UPDATE tasks SET status = %(to)s, result = %(result)s::text, error = %(error)s::text,
    next_attempt_at = COALESCE(%(next_attempt_at)s::double precision, next_attempt_at),
    attempts = attempts - %(refund)s::integer,
    invalid_outputs = invalid_outputs + %(invalid)s::integer,
    cost_actual = COALESCE(%(cost_actual)s::double precision, cost_actual),
    finished_at = CASE WHEN %(terminal)s::boolean THEN %(now)s::double precision END,
    updated_at = %(now)s, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    cancel_requested = false, parked = false,
    callback_state = CASE WHEN %(terminal)s::boolean AND callback_url IS NOT NULL
                          THEN 'pending' ELSE callback_state END,
    callback_next_at = CASE WHEN %(terminal)s::boolean AND callback_url IS NOT NULL
                            THEN %(now)s::double precision ELSE callback_next_at END
WHERE id = %(id)s AND status = %(expected)s
  AND (%(token)s::text IS NULL OR lease_token = %(token)s::text)
  AND (NOT %(parked)s::boolean OR parked)
RETURNING id, tenant, fingerprint, attempts;

-- name: status_of
SELECT status FROM tasks WHERE id = %(id)s;

-- All the leases of one heartbeat in one statement; the ones not returned are lost.
-- name: heartbeat
UPDATE tasks SET lease_expires_at = %(expires_at)s, updated_at = %(now)s
FROM unnest(%(ids)s::text[], %(tokens)s::text[]) AS held(id, token)
WHERE tasks.id = held.id AND tasks.status = 'running' AND tasks.lease_token = held.token
RETURNING tasks.id, tasks.cancel_requested;

-- name: set_upstream_ref
UPDATE tasks SET upstream_ref = %(ref)s, updated_at = %(now)s
WHERE id = %(id)s AND status = 'running' AND lease_token = %(token)s;

-- name: cancel_now
UPDATE tasks SET status = 'cancelled', error = %(error)s, finished_at = %(now)s,
    updated_at = %(now)s, waits_for = NULL,
    callback_state = CASE WHEN callback_url IS NOT NULL THEN 'pending' ELSE callback_state END,
    callback_next_at = CASE WHEN callback_url IS NOT NULL THEN %(now)s
                            ELSE callback_next_at END
WHERE id = %(id)s AND status = %(expected)s
RETURNING id;

-- name: request_cancel_running
UPDATE tasks SET cancel_requested = true, updated_at = %(now)s
WHERE id = %(id)s AND status = 'running';

-- name: manual_retry
UPDATE tasks SET status = 'queued', attempts = 0, invalid_outputs = 0, result = NULL,
    error = NULL, callback_state = NULL, callback_attempts = 0, poll_attempts = 0,
    finished_at = NULL, next_attempt_at = %(now)s, updated_at = %(now)s,
    deadline_at = CASE WHEN deadline_at IS NULL THEN NULL
                       ELSE %(now)s + (deadline_at - created_at) END
WHERE id = %(id)s AND status = %(expected)s
RETURNING id;

-- name: expired_leases
SELECT * FROM tasks WHERE status = 'running' AND lease_expires_at < %(now)s
ORDER BY lease_expires_at LIMIT %(limit)s;

-- name: past_deadline
SELECT * FROM tasks
WHERE status IN ('queued', 'running', 'retrying') AND deadline_at IS NOT NULL
  AND deadline_at < %(now)s
ORDER BY deadline_at LIMIT %(limit)s;

-- name: purge_results
UPDATE tasks SET result = NULL, error = NULL
WHERE finished_at IS NOT NULL AND finished_at < %(before)s
  AND (result IS NOT NULL OR error IS NOT NULL);

-- name: purge_fingerprints
DELETE FROM fingerprints WHERE state = 'succeeded' AND updated_at < %(before)s;

-- name: purge_rows
DELETE FROM tasks WHERE finished_at IS NOT NULL AND finished_at < %(before)s
  AND status IN ('succeeded', 'failed', 'dead', 'timeout', 'cancelled', 'deduped');

-- name: purge_events
DELETE FROM task_events WHERE at < %(before)s;

-- name: purge_keys
DELETE FROM request_keys WHERE expires_at < %(now)s;

-- name: try_lead
INSERT INTO leaders (name, owner, expires_at) VALUES (%(name)s, %(owner)s, %(expires_at)s)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
WHERE leaders.owner = excluded.owner OR leaders.expires_at < %(now)s
RETURNING owner;

-- name: stats
SELECT kind, status, count(*) AS count FROM tasks GROUP BY kind, status;

-- name: list_tasks
SELECT * FROM tasks
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s::text)
  AND (%(batch_id)s::text IS NULL OR batch_id = %(batch_id)s::text)
  AND seq > %(after_seq)s
ORDER BY seq LIMIT %(limit)s;

-- name: park
UPDATE tasks SET parked = true, upstream_ref = %(ref)s, next_attempt_at = %(poll_at)s,
    poll_attempts = poll_attempts + %(polled)s::integer, lease_owner = NULL,
    lease_token = NULL, lease_expires_at = NULL, updated_at = %(now)s
WHERE id = %(id)s AND status = 'running' AND lease_token = %(token)s;

-- name: claim_parked
WITH picked AS MATERIALIZED (
    SELECT seq FROM tasks
    WHERE status = 'running' AND parked AND next_attempt_at <= %(now)s
      AND kind = ANY(%(kinds)s::text[])
    ORDER BY next_attempt_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
UPDATE tasks SET parked = false, lease_owner = %(owner)s, lease_token = %(token)s,
    lease_expires_at = %(expires_at)s, updated_at = %(now)s
WHERE seq IN (SELECT seq FROM picked)
RETURNING *;

-- name: next_parked_at
SELECT min(next_attempt_at) AS at FROM tasks WHERE status = 'running' AND parked;

-- name: find_upstream
SELECT * FROM tasks WHERE kind = %(kind)s AND upstream_ref = %(ref)s LIMIT 1;

-- name: due_callbacks
SELECT * FROM tasks WHERE callback_state = 'pending' AND callback_next_at <= %(now)s
ORDER BY callback_next_at LIMIT %(limit)s;

-- name: callback_result
UPDATE tasks SET callback_state = %(state)s, callback_attempts = callback_attempts + 1,
    callback_next_at = %(next_at)s::double precision
WHERE id = %(id)s AND callback_state = 'pending';

-- Delivered at commit to every LISTENing store; the payload names the schema, so stores on
-- other schemas of the same database ignore it.
-- name: notify_changes
SELECT pg_notify('floodway_changes', current_schema());

-- name: listen_changes
LISTEN floodway_changes;

-- name: current_schema
SELECT current_schema() AS name;

-- Migrations are applied by whoever starts first; the others wait here, then find them done.
-- Keyed on search_path so stores on different schemas do not queue behind each other.
-- name: migrations_lock
SELECT pg_advisory_xact_lock(1718382448, hashtext(current_setting('search_path')));

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
SELECT version FROM schema_migrations ORDER BY version;

-- name: migration_done
INSERT INTO schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: batch_counts
SELECT status, count(*) AS count FROM tasks
WHERE batch_id = %(batch_id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
GROUP BY status;
