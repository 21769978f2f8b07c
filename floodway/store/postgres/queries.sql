-- Named queries of the PostgreSQL store. Each block starts with "-- name: NAME"; the names
-- match the SQLite store's (a contract test checks it). The ledger's rules decide which to run
-- (floodway/store/rules.py); this file only says how. Times are parameters (the engine's
-- clock), never the database's. Parameters that may be NULL carry a cast, because PostgreSQL
-- cannot infer the type of an untyped NULL.
--
-- Statements on many rows take them as one JSON array of objects (%(rows)s), read with
-- json_to_recordset: one string to send, where an array per column costs the driver a
-- conversion per element. WITH ORDINALITY keeps the caller's order. Those that find existing
-- rows also match the keys with `= ANY(ARRAY(...))`: the planner cannot see how few rows a
-- function returns, and would otherwise scan a whole table of a few thousand rows to join.

-- -- tasks and their events -----------------------------------------------------------------

-- name: insert_task
INSERT INTO tasks (id, kind, status, lane, lane_rank, rank_at, tenant, input, max_attempts,
                   idempotency_key, fingerprint, cost_estimated, spend_hold, created_at,
                   updated_at, deadline_at, next_attempt_at, metadata, callback_url, batch_id,
                   tier)
VALUES (%(id)s, %(kind)s, 'queued', %(lane)s, %(lane_rank)s, %(rank_at)s, %(tenant)s, %(input)s,
        %(max_attempts)s, %(idempotency_key)s::text, %(fingerprint)s::text, %(cost_estimated)s,
        %(spend_hold)s, %(now)s, %(now)s, %(deadline_at)s::double precision, %(now)s, %(metadata)s,
        %(callback_url)s::text, %(batch_id)s::text, %(tier)s::text)
RETURNING *;

-- Many submits' tasks in one statement: the rows in the given order (seq follows it), their
-- queued events, and the fingerprints nobody holds yet. A task with a request key is inserted
-- only if this statement reserves its key (the keys in one order, so two batches do not
-- deadlock on them); the rule takes the others one by one. owns_work is false for a task
-- whose fingerprint someone else (or an earlier task of this statement) already holds.
-- name: insert_tasks
WITH given AS (
    SELECT * FROM ROWS FROM (json_to_recordset(%(rows)s::json) AS (
            id text, kind text, lane text, lane_rank integer, rank_at double precision,
            tenant text, input text, max_attempts integer, idempotency_key text,
            fingerprint text, cost_estimated double precision, spend_hold double precision,
            now double precision, deadline_at double precision, metadata text,
            callback_url text, batch_id text, tier text, request_hash text,
            key_expires_at double precision))
        WITH ORDINALITY AS g(id, kind, lane, lane_rank, rank_at, tenant, input, max_attempts,
                             idempotency_key, fingerprint, cost_estimated, spend_hold, now,
                             deadline_at, metadata, callback_url, batch_id, tier, request_hash,
                             key_expires_at, ord)
), keyed AS (
    INSERT INTO request_keys (tenant, key, task_id, request_hash, expires_at)
    SELECT tenant, idempotency_key, id, request_hash, key_expires_at FROM given
    WHERE idempotency_key IS NOT NULL ORDER BY tenant, idempotency_key, ord
    ON CONFLICT (tenant, key) DO NOTHING
    RETURNING task_id
), inserted AS (
    INSERT INTO tasks (id, kind, status, lane, lane_rank, rank_at, tenant, input,
                       max_attempts, idempotency_key, fingerprint, cost_estimated, spend_hold,
                       created_at, updated_at, deadline_at, next_attempt_at, metadata,
                       callback_url, batch_id, tier)
    SELECT id, kind, 'queued', lane, lane_rank, rank_at, tenant, input, max_attempts,
           idempotency_key, fingerprint, cost_estimated, spend_hold, now, now, deadline_at, now,
           metadata, callback_url, batch_id, tier
    FROM given
    WHERE idempotency_key IS NULL OR id IN (SELECT task_id FROM keyed)
    ORDER BY ord
    RETURNING *
), queued AS (
    INSERT INTO task_events (task_id, status, at, attempt, detail)
    SELECT id, 'queued', created_at, 0, '' FROM inserted ORDER BY seq
), owned AS (
    INSERT INTO fingerprints (fingerprint, task_id, state, updated_at)
    SELECT fingerprint, id, 'inflight', created_at FROM inserted
    WHERE fingerprint IS NOT NULL ORDER BY seq
    ON CONFLICT (fingerprint) DO NOTHING
    RETURNING task_id
)
SELECT inserted.*, owned.task_id IS NOT NULL AS owns_work
FROM inserted LEFT JOIN owned ON owned.task_id = inserted.id;

-- name: get_task
SELECT * FROM tasks WHERE id = %(id)s;

-- Lock the row first, so a cancel or a manual retry sees the status it is about to replace.
-- name: lock_task
SELECT * FROM tasks WHERE id = %(id)s FOR UPDATE;

-- name: insert_event
INSERT INTO task_events (task_id, status, at, attempt, detail)
VALUES (%(task_id)s, %(status)s, %(at)s, %(attempt)s, %(detail)s);

-- name: list_events
SELECT seq, task_id, status, at, attempt, detail FROM task_events
WHERE task_id = %(task_id)s AND seq > %(after_seq)s ORDER BY seq;

-- -- request keys and the interactive depth ---------------------------------------------

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

-- -- the work: fingerprints, waiters ------------------------------------------------------

-- name: claim_fingerprint
INSERT INTO fingerprints (fingerprint, task_id, state, updated_at)
VALUES (%(fingerprint)s, %(task_id)s, 'inflight', %(now)s)
ON CONFLICT (fingerprint) DO NOTHING;

-- The owner's row lock: a new submitter holds it while it decides to wait, an ending owner
-- while it resolves or promotes its waiters, so neither misses the other.
-- name: lock_fingerprint
SELECT f.task_id, f.state, t.tenant FROM fingerprints f LEFT JOIN tasks t ON t.id = f.task_id
WHERE f.fingerprint = %(fingerprint)s FOR UPDATE OF f;

-- name: fingerprint_succeeded
UPDATE fingerprints SET state = 'succeeded', updated_at = %(now)s
WHERE fingerprint = %(fingerprint)s AND task_id = %(task_id)s;

-- The rows' locks come first, as in fingerprint_succeeded.
-- name: fingerprints_succeeded
WITH given AS (
    SELECT * FROM json_to_recordset(%(rows)s::json) AS (fingerprint text, task_id text))
UPDATE fingerprints SET state = 'succeeded', updated_at = %(now)s
FROM given
WHERE fingerprints.fingerprint = ANY(ARRAY(SELECT fingerprint FROM given))
  AND fingerprints.fingerprint = given.fingerprint AND fingerprints.task_id = given.task_id
RETURNING fingerprints.task_id;

-- name: fingerprint_handover
UPDATE fingerprints SET task_id = %(new_task_id)s, updated_at = %(now)s
WHERE fingerprint = %(fingerprint)s AND task_id = %(task_id)s;

-- A sampled request takes over work that succeeded: it runs anew (the lock is held).
-- name: fingerprint_resample
UPDATE fingerprints SET task_id = %(task_id)s, state = 'inflight', updated_at = %(now)s
WHERE fingerprint = %(fingerprint)s AND state = 'succeeded';

-- name: fingerprint_drop
DELETE FROM fingerprints WHERE fingerprint = %(fingerprint)s AND task_id = %(task_id)s;

-- name: mark_deduped
UPDATE tasks SET status = 'deduped', duplicate_of = %(duplicate_of)s::text, waits_for = NULL,
    spend_hold = 0, upstream_request_id = %(upstream_request_id)s::text,
    result = %(result)s::text, finished_at = %(now)s, updated_at = %(now)s,
    callback_state = CASE WHEN callback_url IS NOT NULL THEN 'pending' ELSE callback_state END,
    callback_next_at = CASE WHEN callback_url IS NOT NULL THEN %(now)s
                            ELSE callback_next_at END
WHERE id = %(id)s AND status = 'queued';

-- name: wait_for
UPDATE tasks SET waits_for = %(waits_for)s, duplicate_of = %(duplicate_of)s::text
WHERE id = %(id)s;

-- A waiter lends the work its lane, so waiting for the work is never slower than running it.
-- name: lend_urgency
UPDATE tasks SET lane_rank = %(lane_rank)s
WHERE id = %(id)s AND lane_rank > %(lane_rank)s AND status IN ('queued', 'retrying');

-- name: inherit_urgency
UPDATE tasks SET lane_rank = w.rank
FROM (SELECT min(lane_rank) AS rank FROM tasks
      WHERE waits_for = %(id)s AND status = 'queued') AS w
WHERE tasks.id = %(id)s AND tasks.lane_rank > w.rank;

-- Every queued waiter of many owners takes its owner's result, with its event: the owner's
-- detail, or %(shared)s for another tenant's waiter (whose duplicate_of stays NULL).
-- name: resolve_waiters_of
WITH given AS (SELECT * FROM json_to_recordset(%(rows)s::json)
               AS (owner text, result text, detail text)),
owners AS (
    SELECT given.owner, given.result, given.detail, t.tenant, t.upstream_request_id FROM given
    JOIN tasks t ON t.id = given.owner
    WHERE t.id = ANY(ARRAY(SELECT owner FROM given))
), resolved AS (
    UPDATE tasks SET status = 'deduped', waits_for = NULL, result = w.result,
        finished_at = %(now)s, updated_at = %(now)s, spend_hold = 0,
        upstream_request_id = w.upstream_request_id,
        duplicate_of = CASE WHEN tasks.tenant = w.tenant THEN w.owner END,
        callback_state = CASE WHEN callback_url IS NOT NULL THEN 'pending'
                              ELSE callback_state END,
        callback_next_at = CASE WHEN callback_url IS NOT NULL THEN %(now)s
                                ELSE callback_next_at END
    FROM owners AS w
    WHERE tasks.waits_for = ANY(ARRAY(SELECT owner FROM given))
      AND tasks.waits_for = w.owner AND tasks.status = 'queued'
    RETURNING tasks.id, tasks.tenant, tasks.seq, tasks.duplicate_of, w.owner, w.detail
), logged AS (
    INSERT INTO task_events (task_id, status, at, attempt, detail)
    SELECT id, 'deduped', %(now)s, 0,
           CASE WHEN duplicate_of IS NULL THEN %(shared)s::text ELSE detail END
    FROM resolved ORDER BY seq
)
SELECT id, tenant, owner FROM resolved ORDER BY seq;

-- Locked, so a concurrent cancel of the heir cannot slip between choosing and promoting it.
-- name: first_waiter
SELECT id, tenant FROM tasks WHERE waits_for = %(waits_for)s AND status = 'queued'
ORDER BY seq LIMIT 1 FOR UPDATE;

-- name: promote_waiter
UPDATE tasks SET waits_for = NULL, duplicate_of = NULL, next_attempt_at = %(now)s,
    updated_at = %(now)s
WHERE id = %(id)s;

-- name: repoint_waiters
UPDATE tasks SET waits_for = %(new_task_id)s,
    duplicate_of = CASE WHEN tasks.tenant = h.tenant THEN h.id END
FROM (SELECT id, tenant FROM tasks WHERE id = %(new_task_id)s) AS h
WHERE tasks.waits_for = %(waits_for)s AND tasks.status = 'queued';

-- -- dispatch -------------------------------------------------------------------------------

-- name: ready
-- Up to the limit of ready tasks of EACH tenant with work, so admission control can take turns.
-- The recursive part is a skip-scan over tasks_ready_tenant (one index probe per tenant);
-- the lateral part reads each tenant's queue in dispatch order along the same index.
-- lane_rank, not lane: the lane a task is dispatched in may be one a waiter lent it. Then
-- rank_at: a job's steps rank at their job's submit, ahead of work that came later.
WITH RECURSIVE tenants(name) AS (
    SELECT min(tenant) FROM tasks
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL
    UNION ALL
    SELECT (SELECT min(tenant) FROM tasks
            WHERE status IN ('queued', 'retrying') AND waits_for IS NULL
              AND tenant > tenants.name)
    FROM tenants WHERE tenants.name IS NOT NULL
)
SELECT t.id, t.kind, t.tenant, t.lane_rank, t.cost_estimated, t.seq, t.rank_at,
       t.deadline_at
FROM tenants CROSS JOIN LATERAL (
    SELECT y.* FROM tasks y
    WHERE y.tenant = tenants.name AND y.status IN ('queued', 'retrying')
      AND y.waits_for IS NULL AND y.next_attempt_at <= %(now)s
      AND y.kind = ANY(%(kinds)s::text[])
    ORDER BY y.lane_rank, y.rank_at, y.seq
    LIMIT %(limit)s) AS t
ORDER BY t.lane_rank, t.rank_at, t.seq;

-- One statement: pick in dispatch order along tasks_ready, skipping rows another claimer
-- holds, move them to running and log their running events. MATERIALIZED runs the pick
-- exactly once, so LIMIT bounds the rows updated whatever plan the UPDATE gets; and
-- `= ANY(ARRAY(...))` makes that plan a primary-key lookup (`IN (SELECT ...)` got a scan of
-- the whole table at a few thousand rows).
-- name: claim_next
WITH picked AS MATERIALIZED (
    SELECT seq FROM tasks
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL
      AND next_attempt_at <= %(now)s AND kind = ANY(%(kinds)s::text[])
    ORDER BY lane_rank, rank_at, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE tasks SET status = 'running', attempts = attempts + 1, lease_owner = %(owner)s,
        lease_token = %(token)s, lease_expires_at = %(expires_at)s, attempt_at = %(now)s,
        call_ends_by = %(now)s + (%(bounds)s::jsonb ->> kind)::double precision,
        started_at = COALESCE(started_at, %(now)s), updated_at = %(now)s
    WHERE seq = ANY(ARRAY(SELECT seq FROM picked))
    RETURNING *
), logged AS (
    INSERT INTO task_events (task_id, status, at, attempt, detail)
    SELECT id, 'running', %(now)s, attempts, %(owner)s FROM claimed ORDER BY lane_rank, rank_at, seq
)
SELECT * FROM claimed;

-- A row another claimer is moving is waited for and then re-checked, so it is taken once.
-- name: claim_ids
WITH claimed AS (
    UPDATE tasks SET status = 'running', attempts = attempts + 1, lease_owner = %(owner)s,
        lease_token = %(token)s, lease_expires_at = %(expires_at)s, attempt_at = %(now)s,
        call_ends_by = %(now)s + (%(bounds)s::jsonb ->> kind)::double precision,
        started_at = COALESCE(started_at, %(now)s), updated_at = %(now)s
    WHERE id = ANY(%(ids)s::text[])
      AND status IN ('queued', 'retrying') AND waits_for IS NULL
    RETURNING *
), logged AS (
    INSERT INTO task_events (task_id, status, at, attempt, detail)
    SELECT id, 'running', %(now)s, attempts, %(owner)s FROM claimed ORDER BY lane_rank, rank_at, seq
)
SELECT * FROM claimed;

-- -- status writes and attempts -------------------------------------------------------------

-- The attempt: closed (lease cleared), kept as it is (keep_attempt: the call goes on under
-- its worker's lease), or left open without a worker until orphan_until.
-- name: complete
UPDATE tasks SET status = %(to)s, result = %(result)s::text, error = %(error)s::text,
    next_attempt_at = COALESCE(%(next_attempt_at)s::double precision, next_attempt_at),
    attempts = attempts - %(refund)s::integer,
    invalid_outputs = invalid_outputs + %(invalid)s::integer,
    cost_actual = CASE WHEN %(cost_actual)s::double precision IS NULL THEN cost_actual
                       ELSE COALESCE(cost_actual, 0) + %(cost_actual)s::double precision END,
    finished_at = CASE WHEN %(terminal)s::boolean THEN %(now)s::double precision END,
    updated_at = %(now)s,
    lease_owner = CASE WHEN %(keep_attempt)s::boolean THEN lease_owner END,
    -- a parked task's job has no lease: an orphan of it is named after the task
    lease_token = CASE WHEN %(keep_attempt)s::boolean
                        OR %(orphan_until)s::double precision IS NOT NULL
                       THEN COALESCE(lease_token, 'orphan:' || id) END,
    lease_expires_at = CASE WHEN %(keep_attempt)s::boolean THEN lease_expires_at
                            ELSE %(orphan_until)s::double precision END,
    cancel_requested = false, parked = false,
    upstream_request_id = COALESCE(%(upstream_request_id)s::text, upstream_request_id),
    callback_state = CASE WHEN %(terminal)s::boolean AND callback_url IS NOT NULL
                          THEN 'pending' ELSE callback_state END,
    callback_next_at = CASE WHEN %(terminal)s::boolean AND callback_url IS NOT NULL
                            THEN %(now)s::double precision ELSE callback_next_at END
WHERE id = %(id)s AND status = %(expected)s
  AND (%(token)s::text IS NULL OR lease_token = %(token)s::text)
  AND (NOT %(parked)s::boolean OR parked)
RETURNING id, tenant, fingerprint, attempts;

-- The compare-and-set of `complete` for many tasks at once (distinct ids), with their events
-- in the given order; the tasks it did not move are the ones not returned.
-- name: complete_many
WITH given AS (
    SELECT * FROM ROWS FROM (json_to_recordset(%(rows)s::json) AS (
            id text, expected text, token text, "to" text, result text, error text,
            next_attempt_at double precision, refund integer, invalid integer,
            cost_actual double precision, terminal boolean, parked boolean,
            keep_attempt boolean, orphan_until double precision, upstream_request_id text,
            detail text))
        WITH ORDINALITY AS c(id, expected, token, dest, result, error, next_attempt_at,
                             refund, invalid, cost_actual, terminal, parked, keep_attempt,
                             orphan_until, upstream_request_id, detail, ord)
), moved AS (
    UPDATE tasks SET status = c.dest, result = c.result, error = c.error,
        next_attempt_at = COALESCE(c.next_attempt_at, tasks.next_attempt_at),
        attempts = tasks.attempts - c.refund,
        invalid_outputs = tasks.invalid_outputs + c.invalid,
        cost_actual = CASE WHEN c.cost_actual IS NULL THEN tasks.cost_actual
                           ELSE COALESCE(tasks.cost_actual, 0) + c.cost_actual END,
        finished_at = CASE WHEN c.terminal THEN %(now)s::double precision END,
        updated_at = %(now)s,
        lease_owner = CASE WHEN c.keep_attempt THEN tasks.lease_owner END,
        lease_token = CASE WHEN c.keep_attempt OR c.orphan_until IS NOT NULL
                           THEN COALESCE(tasks.lease_token, 'orphan:' || tasks.id) END,
        lease_expires_at = CASE WHEN c.keep_attempt THEN tasks.lease_expires_at
                                ELSE c.orphan_until END,
        cancel_requested = false, parked = false,
        upstream_request_id = COALESCE(c.upstream_request_id, tasks.upstream_request_id),
        callback_state = CASE WHEN c.terminal AND tasks.callback_url IS NOT NULL
                              THEN 'pending' ELSE tasks.callback_state END,
        callback_next_at = CASE WHEN c.terminal AND tasks.callback_url IS NOT NULL
                                THEN %(now)s::double precision ELSE tasks.callback_next_at END
    FROM given AS c
    WHERE tasks.id = ANY(ARRAY(SELECT id FROM given))
      AND tasks.id = c.id AND tasks.status = c.expected
      AND (c.token IS NULL OR tasks.lease_token = c.token)
      AND (NOT c.parked OR tasks.parked)
    RETURNING tasks.id, tasks.tenant, tasks.fingerprint, tasks.attempts, c.dest, c.detail,
              c.ord
), logged AS (
    INSERT INTO task_events (task_id, status, at, attempt, detail)
    SELECT id, dest, %(now)s, attempts, detail FROM moved ORDER BY ord
)
SELECT id, tenant, fingerprint, attempts FROM moved;

-- name: attempt_of
SELECT id, status, lease_token FROM tasks WHERE id = %(id)s;

-- name: attempts_of_ids
SELECT id, status, lease_token FROM tasks WHERE id = ANY(%(ids)s::text[]);

-- name: close_attempt
UPDATE tasks SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    result = CASE WHEN %(succeeded)s::boolean THEN %(result)s::text ELSE result END,
    updated_at = %(now)s,
    upstream_request_id = COALESCE(%(upstream_request_id)s::text, upstream_request_id)
WHERE id = %(id)s AND lease_token = %(token)s
  AND status IN ('succeeded', 'failed', 'dead', 'timeout', 'cancelled', 'deduped')
RETURNING status, tenant, fingerprint;

-- name: orphan_attempt
UPDATE tasks SET lease_owner = NULL, lease_expires_at = %(until)s, updated_at = %(now)s
WHERE id = %(id)s AND lease_token = %(token)s;

-- All the leases of one heartbeat in one statement; the ones not returned are lost.
-- A task that ended under its lease (cancelled or past its deadline mid-call) is reported as
-- cancelled: its handler may stop; its call is read to its end either way.
-- name: heartbeat
WITH held AS (SELECT * FROM json_to_recordset(%(rows)s::json) AS (id text, token text))
UPDATE tasks SET lease_expires_at = %(expires_at)s, updated_at = %(now)s
FROM held
WHERE tasks.id = ANY(ARRAY(SELECT id FROM held))
  AND tasks.id = held.id AND tasks.lease_token = held.token AND tasks.lease_owner IS NOT NULL
RETURNING tasks.id, tasks.cancel_requested OR tasks.status <> 'running' AS cancel_requested;

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

-- A parked task's poll falls due at once: the poller cancels its upstream job now, not at the
-- next poll (which may be a minute away).
-- name: request_cancel_running
UPDATE tasks SET cancel_requested = true, updated_at = %(now)s,
    next_attempt_at = CASE WHEN parked THEN %(now)s::double precision ELSE next_attempt_at END
WHERE id = %(id)s AND status = 'running';

-- name: manual_retry
UPDATE tasks SET status = 'queued', attempts = 0, invalid_outputs = 0, result = NULL,
    error = NULL, waits_for = NULL, duplicate_of = NULL, callback_state = NULL,
    callback_attempts = 0, poll_attempts = 0, finished_at = NULL,
    next_attempt_at = %(now)s, updated_at = %(now)s,
    deadline_at = CASE WHEN deadline_at IS NULL THEN NULL
                       ELSE %(now)s + (deadline_at - created_at) END
WHERE id = %(id)s AND status = %(expected)s
RETURNING id;

-- -- upstream jobs and callbacks --------------------------------------------------------------

-- A task whose batch line ended while it was being polled is due at once: the batch's end
-- woke only the tasks parked then, and this poll read the line before it ended.
-- name: park
UPDATE tasks SET parked = true, upstream_ref = %(ref)s,
    next_attempt_at = CASE WHEN EXISTS (
        SELECT 1 FROM upstream_lines l
        WHERE l.task_id = %(id)s AND l.state = ANY(%(ended_lines)s::text[])
    ) THEN %(now)s ELSE %(poll_at)s END,
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
WHERE seq = ANY(ARRAY(SELECT seq FROM picked))
RETURNING *;

-- name: next_parked_at
SELECT min(next_attempt_at) AS at FROM tasks WHERE status = 'running' AND parked;

-- name: hasten_parked
UPDATE tasks SET next_attempt_at = %(now)s
WHERE status = 'running' AND parked AND kind = %(kind)s AND next_attempt_at > %(now)s
  AND started_at <= %(now)s::float8 - %(older_than)s::float8;

-- name: find_upstream
SELECT * FROM tasks WHERE kind = %(kind)s AND upstream_ref = %(ref)s LIMIT 1;

-- name: due_callbacks
SELECT * FROM tasks WHERE callback_state = 'pending' AND callback_next_at <= %(now)s
ORDER BY callback_next_at LIMIT %(limit)s;

-- name: callback_result
UPDATE tasks SET callback_state = %(state)s, callback_attempts = callback_attempts + 1,
    callback_next_at = %(next_at)s::double precision
WHERE id = %(id)s AND callback_state = 'pending';

-- A completion's effects, in its transaction (migration 011).
-- name: insert_effects
INSERT INTO effects (task_id, effect, due_at)
SELECT g.task_id, g.effect, %(now)s
FROM json_to_recordset(%(rows)s::json) AS g(task_id text, effect text);

-- name: due_effects
SELECT e.seq AS effect_seq, e.effect, e.attempts AS effect_attempts, t.*
FROM effects e JOIN tasks t ON t.id = e.task_id
WHERE e.due_at <= %(now)s ORDER BY e.due_at LIMIT %(limit)s;

-- name: effect_done
DELETE FROM effects WHERE seq = %(seq)s;

-- name: effect_retry
UPDATE effects SET attempts = attempts + 1, due_at = %(due_at)s WHERE seq = %(seq)s;

-- -- recovery and maintenance -----------------------------------------------------------------

-- name: open_attempts
SELECT * FROM tasks WHERE lease_token IS NOT NULL OR (status = 'running' AND parked)
ORDER BY lease_expires_at LIMIT %(limit)s;

-- name: lease_owners
SELECT DISTINCT lease_owner FROM tasks
WHERE lease_token IS NOT NULL AND lease_owner IS NOT NULL;

-- name: expired_leases
SELECT * FROM tasks
WHERE lease_token IS NOT NULL AND lease_owner IS NOT NULL AND lease_expires_at < %(now)s
ORDER BY lease_expires_at LIMIT %(limit)s;

-- name: attempts_of
SELECT * FROM tasks
WHERE lease_token IS NOT NULL AND lease_owner = ANY(%(owners)s::text[])
ORDER BY lease_expires_at LIMIT %(limit)s;

-- name: ended_orphans
SELECT * FROM tasks
WHERE lease_token IS NOT NULL AND lease_owner IS NULL AND lease_expires_at < %(now)s
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
  AND status IN ('succeeded', 'failed', 'dead', 'timeout', 'cancelled', 'deduped')
  AND lease_token IS NULL;

-- name: purge_events
DELETE FROM task_events WHERE at < %(before)s;

-- name: purge_keys
DELETE FROM request_keys WHERE expires_at < %(now)s;

-- name: try_lead
INSERT INTO leaders (name, owner, expires_at) VALUES (%(name)s, %(owner)s, %(expires_at)s)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
WHERE leaders.owner = excluded.owner OR leaders.expires_at < %(now)s
RETURNING owner;

-- name: leader
SELECT owner, expires_at FROM leaders WHERE name = %(name)s;

-- name: take_lead
UPDATE leaders SET owner = %(owner)s, expires_at = %(expires_at)s
WHERE name = %(name)s AND owner = %(dead)s;

-- A dead process's leases: free at once, not when they expire.
-- name: drop_leases
DELETE FROM leaders WHERE substr(owner, 1, length(%(prefix)s)) = %(prefix)s;

-- -- reading ----------------------------------------------------------------------------------

-- -- spend and budgets -----------------------------------------------------------------------

-- Every check of one tenant's budget, and the inserts it allows, queue on this lock (until the
-- transaction ends): fleet-wide, since every API process checks in the one ledger.
-- name: lock_tenant_budget
SELECT pg_advisory_xact_lock(1718382448, hashtext(%(tenant)s));

-- What a tenant spent since a period began, and what its unfinished tasks may still cost,
-- read in one statement (one snapshot: a task that ends between two reads would be in
-- neither).
-- name: budget_used
SELECT (SELECT COALESCE(sum(cost), 0) FROM spend WHERE tenant = %(tenant)s AND at >= %(since)s)
           AS spent,
       (SELECT COALESCE(sum(spend_hold), 0) FROM tasks
        WHERE tenant = %(tenant)s AND spend_hold > 0
          AND (status IN ('queued', 'running', 'retrying') OR lease_token IS NOT NULL)) AS held;

-- name: insert_spend
INSERT INTO spend (task_id, tenant, kind, at, cost, input_tokens, output_tokens, images,
                   over_estimate, tier, tier_saved, possibly)
SELECT t.id, t.tenant, t.kind, %(at)s, g.cost, g.input_tokens, g.output_tokens, g.images,
       greatest(0, g.cost - t.spend_hold), g.tier, g.tier_saved, g.possibly
FROM json_to_recordset(%(rows)s::json) AS g(
        task_id text, cost double precision, input_tokens double precision,
        output_tokens double precision, images double precision, tier text,
        tier_saved double precision, possibly boolean)
JOIN tasks t ON t.id = g.task_id;

-- name: note_over_estimate
UPDATE tasks SET over_estimate = tasks.over_estimate + (g.cost - tasks.spend_hold)
FROM json_to_recordset(%(rows)s::json) AS g(task_id text, cost double precision)
WHERE tasks.id = g.task_id AND g.cost > tasks.spend_hold;

-- A deduped task saved what its source's work cost.
-- name: insert_saved
INSERT INTO spend (task_id, tenant, kind, at, deduped, saved)
SELECT t.id, t.tenant, t.kind, %(at)s, true,
       (SELECT COALESCE(sum(s.cost), 0) FROM spend s WHERE s.task_id = g.source)
FROM json_to_recordset(%(rows)s::json) AS g(task_id text, source text)
JOIN tasks t ON t.id = g.task_id;

-- name: spend_totals
SELECT tenant, kind, sum(cost) AS cost, sum(saved) AS saved,
       sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
       sum(images) AS images, sum(over_estimate) AS over_estimate,
       count(*) FILTER (WHERE NOT deduped) AS calls, count(*) FILTER (WHERE deduped) AS deduped,
       sum(tier_saved) AS tier_saved
FROM spend
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text) AND at >= %(since)s
GROUP BY tenant, kind ORDER BY tenant, kind;

-- name: spend_series
SELECT floor(at / %(bucket)s) * %(bucket)s AS at, tenant, kind,
       sum(cost) AS cost, sum(saved) AS saved
FROM spend
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text) AND at >= %(since)s
GROUP BY 1, tenant, kind ORDER BY 1, tenant, kind;

-- name: purge_spend
DELETE FROM spend WHERE at < %(before)s;

-- name: stats
SELECT kind, status, count(*) AS count FROM tasks
WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s::text
GROUP BY kind, status;

-- name: list_tasks
SELECT * FROM tasks
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s::text)
  AND (%(batch_id)s::text IS NULL OR batch_id = %(batch_id)s::text)
  AND seq > %(after_seq)s
ORDER BY seq LIMIT %(limit)s;

-- name: recent_timings
SELECT id, kind, status, error::jsonb ->> 'type' AS error_type, attempts, created_at,
       started_at, finished_at
FROM tasks WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s::text
ORDER BY seq DESC LIMIT %(limit)s;

-- name: list_tasks_desc
SELECT * FROM tasks
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s::text)
  AND (%(batch_id)s::text IS NULL OR batch_id = %(batch_id)s::text)
  AND seq < %(before_seq)s
ORDER BY seq DESC LIMIT %(limit)s;

-- name: batch_counts
SELECT status, count(*) AS count FROM tasks
WHERE batch_id = %(batch_id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
GROUP BY status;

-- name: worker_beat
INSERT INTO workers (owner, host, pid, concurrency, kinds, started_at, heartbeat_at)
VALUES (%(owner)s, %(host)s, %(pid)s, %(concurrency)s, %(kinds)s, %(started_at)s, %(now)s)
ON CONFLICT (owner) DO UPDATE SET heartbeat_at = excluded.heartbeat_at;

-- name: drop_stale_workers
DELETE FROM workers WHERE heartbeat_at < %(stale)s;

-- name: worker_gone
DELETE FROM workers WHERE owner = %(owner)s;

-- name: list_workers
SELECT owner, host, pid, concurrency, kinds, started_at, heartbeat_at FROM workers
WHERE heartbeat_at >= %(since)s ORDER BY host, pid, owner;

-- name: worker_tasks
-- The tasks whose lease a listed worker holds: its calls in flight.
SELECT t.lease_owner, t.id, t.kind, t.tenant, t.attempts, t.attempt_at FROM tasks t
JOIN workers w ON t.lease_owner = w.owner
WHERE t.lease_token IS NOT NULL AND w.heartbeat_at >= %(since)s
ORDER BY t.attempt_at, t.seq;

-- name: list_batches
-- A tenant's newest batches (by their newest task), each one's tasks per status.
WITH newest AS (
    SELECT batch_id, max(seq) AS last_seq, min(created_at) AS created_at FROM tasks
    WHERE tenant = %(tenant)s AND batch_id IS NOT NULL
    GROUP BY batch_id ORDER BY max(seq) DESC LIMIT %(limit)s
)
SELECT n.batch_id, n.created_at, n.last_seq, t.status, count(*) AS count
FROM newest n JOIN tasks t ON t.batch_id = n.batch_id AND t.tenant = %(tenant)s
GROUP BY n.batch_id, n.created_at, n.last_seq, t.status
ORDER BY n.last_seq DESC;

-- -- this backend's own: change notices, liveness, migrations ---------------------------------

-- Delivered at commit to every LISTENing store; the payload names the schema, so stores on
-- other schemas of the same database ignore it.
-- name: notify_changes
SELECT pg_notify('floodway_changes', current_schema());

-- name: listen_changes
LISTEN floodway_changes;

-- name: current_schema
SELECT current_schema() AS name;

-- A process's liveness lock: held by its session (the LISTEN connection) for as long as it
-- lives; the server frees it when that session ends. Keyed like the depth lock.
-- name: lock_liveness
SELECT pg_try_advisory_lock(1718382449, hashtext(%(identity)s)) AS held;

-- name: register_liveness
INSERT INTO processes (identity, locked_at)
VALUES (%(identity)s, extract(epoch FROM clock_timestamp()))
ON CONFLICT (identity) DO UPDATE SET locked_at = excluded.locked_at;

-- Dead: registered since the server last started, and no session holds the lock any more.
-- name: dead_processes
SELECT p.identity FROM processes p
WHERE p.identity = ANY(%(identities)s::text[])
  AND p.locked_at > extract(epoch FROM pg_postmaster_start_time())
  AND NOT EXISTS (
      SELECT 1 FROM pg_locks l
      WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
                SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.classid = 1718382449 AND l.objid = hashtext(p.identity)::oid
        AND l.objsubid = 2);

-- name: forget_process
DELETE FROM processes WHERE identity = %(identity)s;

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

-- name: note_request_id
UPDATE tasks SET upstream_request_id = %(upstream_request_id)s WHERE id = %(id)s;

-- name: append_stream
INSERT INTO stream_events (task_id, seq, data, at)
SELECT %(task_id)s, %(first)s + n - 1, e, %(now)s
FROM unnest(%(events)s::text[]) WITH ORDINALITY AS given (e, n)
ON CONFLICT (task_id, seq) DO NOTHING;

-- name: read_stream
SELECT seq, data FROM stream_events WHERE task_id = %(task_id)s AND seq > %(after)s
ORDER BY seq LIMIT %(limit)s;

-- name: purge_streams
DELETE FROM stream_events WHERE at < %(before)s;

-- name: forget_result
UPDATE tasks SET result = NULL
WHERE id = %(id)s AND tenant = %(tenant)s AND finished_at IS NOT NULL;

-- name: forget_stream
DELETE FROM stream_events WHERE task_id = %(id)s;

-- name: keep_server_key
INSERT INTO server_keys (name, value) VALUES (%(name)s, %(value)s) ON CONFLICT (name) DO NOTHING;

-- name: server_key
SELECT value FROM server_keys WHERE name = %(name)s;

-- The server's clock as it is now (not the transaction's start), for LedgerClock.
-- name: server_time
SELECT extract(epoch FROM clock_timestamp())::float8 AS now;
