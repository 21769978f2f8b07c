-- Named queries of the SQLite store. Each block starts with "-- name: NAME"; the names match
-- the PostgreSQL store's (a contract test checks it). The ledger's rules decide which to run
-- (floodway/store/rules.py); this file only says how. Times are parameters (the engine's
-- clock), never the database's. SQLite has one writer, so the "lock_" reads of PostgreSQL are
-- plain reads here: the writer thread's transaction already excludes every other writer.

-- -- tasks and their events -----------------------------------------------------------------

-- name: insert_task
INSERT INTO tasks (id, kind, status, lane, lane_rank, rank_at, tenant, input, max_attempts,
                   idempotency_key, fingerprint, cost_estimated, spend_hold, created_at,
                   updated_at, deadline_at, next_attempt_at, metadata, callback_url, batch_id,
                   tier)
VALUES (:id, :kind, 'queued', :lane, :lane_rank, :rank_at, :tenant, :input, :max_attempts,
        :idempotency_key, :fingerprint, :cost_estimated, :spend_hold, :now, :now,
        :deadline_at, :now, :metadata, :callback_url, :batch_id, :tier)
RETURNING *;

-- name: get_task
SELECT * FROM tasks WHERE id = :id;

-- name: lock_task
SELECT * FROM tasks WHERE id = :id;

-- name: insert_event
INSERT INTO task_events (task_id, status, at, attempt, detail)
VALUES (:task_id, :status, :at, :attempt, :detail);

-- name: list_events
SELECT seq, task_id, status, at, attempt, detail FROM task_events
WHERE task_id = :task_id AND seq > :after_seq ORDER BY seq;

-- -- request keys and the interactive depth ---------------------------------------------

-- Reserve the key before the task exists (a concurrent submitter with the same key then
-- reuses our task instead of creating a second one).
-- name: reserve_request_key
INSERT INTO request_keys (tenant, key, task_id, request_hash, expires_at)
VALUES (:tenant, :key, :task_id, :request_hash, :expires_at)
ON CONFLICT (tenant, key) DO NOTHING;

-- name: lock_request_key
SELECT task_id, request_hash, expires_at FROM request_keys WHERE tenant = :tenant AND key = :key;

-- name: put_request_key
INSERT INTO request_keys (tenant, key, task_id, request_hash, expires_at)
VALUES (:tenant, :key, :task_id, :request_hash, :expires_at)
ON CONFLICT (tenant, key) DO UPDATE SET task_id = excluded.task_id,
    request_hash = excluded.request_hash, expires_at = excluded.expires_at;

-- name: lock_tenant_depth
SELECT :tenant;

-- Its partial index, named: without statistics the planner takes tasks_tenant_seq, a walk of
-- every task the tenant ever had (slower with each submit).
-- name: count_interactive
SELECT count(*) AS depth FROM tasks INDEXED BY tasks_interactive
WHERE tenant = :tenant AND lane = 'interactive' AND status IN ('queued', 'running', 'retrying');

-- -- the work: fingerprints, waiters ------------------------------------------------------

-- name: claim_fingerprint
INSERT INTO fingerprints (fingerprint, task_id, state, updated_at)
VALUES (:fingerprint, :task_id, 'inflight', :now)
ON CONFLICT (fingerprint) DO NOTHING;

-- name: lock_fingerprint
SELECT f.task_id, f.state, t.tenant FROM fingerprints f LEFT JOIN tasks t ON t.id = f.task_id
WHERE f.fingerprint = :fingerprint;

-- name: fingerprint_succeeded
UPDATE fingerprints SET state = 'succeeded', updated_at = :now
WHERE fingerprint = :fingerprint AND task_id = :task_id;

-- name: fingerprints_succeeded
UPDATE fingerprints SET state = 'succeeded', updated_at = :now
FROM (SELECT json_extract(value, '$.fingerprint') AS fingerprint,
             json_extract(value, '$.task_id') AS task_id
      FROM json_each(:rows)) AS given
WHERE fingerprints.fingerprint = given.fingerprint AND fingerprints.task_id = given.task_id
RETURNING task_id;

-- name: fingerprint_handover
UPDATE fingerprints SET task_id = :new_task_id, updated_at = :now
WHERE fingerprint = :fingerprint AND task_id = :task_id;

-- A sampled request takes over work that succeeded: it runs anew (the lock is held).
-- name: fingerprint_resample
UPDATE fingerprints SET task_id = :task_id, state = 'inflight', updated_at = :now
WHERE fingerprint = :fingerprint AND state = 'succeeded';

-- name: fingerprint_drop
DELETE FROM fingerprints WHERE fingerprint = :fingerprint AND task_id = :task_id;

-- name: mark_deduped
UPDATE tasks SET status = 'deduped', duplicate_of = :duplicate_of, waits_for = NULL,
    spend_hold = 0, upstream_request_id = :upstream_request_id,
    result = :result, finished_at = :now, updated_at = :now,
    callback_state = CASE WHEN callback_url IS NOT NULL THEN 'pending' ELSE callback_state END,
    callback_next_at = CASE WHEN callback_url IS NOT NULL THEN :now ELSE callback_next_at END
WHERE id = :id AND status = 'queued';

-- name: wait_for
UPDATE tasks SET waits_for = :waits_for, duplicate_of = :duplicate_of WHERE id = :id;

-- A waiter lends the work its lane, so waiting for the work is never slower than running it.
-- name: lend_urgency
UPDATE tasks SET lane_rank = :lane_rank
WHERE id = :id AND lane_rank > :lane_rank AND status IN ('queued', 'retrying');

-- A task's waiters are found through tasks_waiters: the unary + keeps the planner off the
-- status index, which (without ANALYZE) it prefers, and which lists every queued task.
-- name: inherit_urgency
UPDATE tasks SET lane_rank = (SELECT min(w.lane_rank) FROM tasks w
                              WHERE w.waits_for = :id AND +w.status = 'queued')
WHERE id = :id AND lane_rank > (SELECT min(w.lane_rank) FROM tasks w
                                WHERE w.waits_for = :id AND +w.status = 'queued');

-- The waiters of another tenant see the result, not whose task made it. The owner's row
-- holds its call's request id already (written first, in this transaction).
-- name: resolve_waiters
UPDATE tasks SET status = 'deduped', waits_for = NULL, result = :result, finished_at = :now,
    updated_at = :now, spend_hold = 0,
    upstream_request_id = (SELECT o.upstream_request_id FROM tasks o WHERE o.id = :owner),
    duplicate_of = CASE WHEN tenant = (SELECT o.tenant FROM tasks o WHERE o.id = :owner)
                        THEN :owner END,
    callback_state = CASE WHEN callback_url IS NOT NULL THEN 'pending' ELSE callback_state END,
    callback_next_at = CASE WHEN callback_url IS NOT NULL THEN :now ELSE callback_next_at END
WHERE waits_for = :owner AND +status = 'queued'
RETURNING id, tenant, duplicate_of;

-- name: first_waiter
SELECT id, tenant FROM tasks WHERE waits_for = :waits_for AND +status = 'queued'
ORDER BY seq LIMIT 1;

-- name: promote_waiter
UPDATE tasks SET waits_for = NULL, duplicate_of = NULL, next_attempt_at = :now, updated_at = :now
WHERE id = :id;

-- name: repoint_waiters
UPDATE tasks SET waits_for = :new_task_id,
    duplicate_of = CASE WHEN tenant = (SELECT h.tenant FROM tasks h WHERE h.id = :new_task_id)
                        THEN :new_task_id END
WHERE waits_for = :waits_for AND +status = 'queued';

-- -- dispatch -------------------------------------------------------------------------------

-- name: ready
-- Up to :limit ready tasks of EACH tenant with work, so admission control can take turns.
-- lane_rank, not lane: the lane a task is dispatched in may be one a waiter lent it. Then
-- rank_at: a job's steps rank at their job's submit, ahead of work that came later.
WITH RECURSIVE tenants(name) AS (
    SELECT min(tenant) FROM tasks INDEXED BY tasks_ready_tenant
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL
    UNION ALL
    SELECT (SELECT min(tenant) FROM tasks INDEXED BY tasks_ready_tenant
            WHERE status IN ('queued', 'retrying') AND waits_for IS NULL
              AND tenant > tenants.name)
    FROM tenants WHERE tenants.name IS NOT NULL
)
SELECT t.id, t.kind, t.tenant, t.lane_rank, t.cost_estimated, t.seq, t.rank_at,
       t.deadline_at
FROM tenants JOIN tasks t ON t.seq IN (
    SELECT y.seq FROM tasks y INDEXED BY tasks_ready_tenant
    WHERE y.tenant = tenants.name AND y.status IN ('queued', 'retrying')
      AND y.waits_for IS NULL AND y.next_attempt_at <= :now
      AND y.kind IN (SELECT value FROM json_each(:kinds))
    ORDER BY y.lane_rank, y.rank_at, y.seq
    LIMIT :limit)
ORDER BY t.lane_rank, t.rank_at, t.seq;

-- name: claim_next
UPDATE tasks SET status = 'running', attempts = attempts + 1, lease_owner = :owner,
    lease_token = :token, lease_expires_at = :expires_at, attempt_at = :now,
    call_ends_by = :now + (SELECT b.value FROM json_each(:bounds) AS b WHERE b.key = kind),
    started_at = COALESCE(started_at, :now), updated_at = :now
WHERE seq IN (
    -- INDEXED BY: walk the queue in dispatch order and stop at LIMIT; left to itself the
    -- planner may pick the status index and sort every queued row (325 ms at 1M rows).
    SELECT seq FROM tasks INDEXED BY tasks_ready
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL AND next_attempt_at <= :now
      AND kind IN (SELECT value FROM json_each(:kinds))
    ORDER BY lane_rank, rank_at, seq
    LIMIT :limit)
RETURNING *;

-- name: claim_ids
UPDATE tasks SET status = 'running', attempts = attempts + 1, lease_owner = :owner,
    lease_token = :token, lease_expires_at = :expires_at, attempt_at = :now,
    call_ends_by = :now + (SELECT b.value FROM json_each(:bounds) AS b WHERE b.key = kind),
    started_at = COALESCE(started_at, :now), updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids))
  AND +status IN ('queued', 'retrying') AND waits_for IS NULL  -- by id, not the status index
RETURNING *;

-- -- status writes and attempts -------------------------------------------------------------

-- The attempt: closed (lease cleared), kept as it is (:keep_attempt: the call goes on under
-- its worker's lease), or left open without a worker until :orphan_until.
-- name: complete
UPDATE tasks SET status = :to, result = :result, error = :error,
    next_attempt_at = COALESCE(:next_attempt_at, next_attempt_at),
    attempts = attempts - :refund, invalid_outputs = invalid_outputs + :invalid,
    cost_actual = CASE WHEN :cost_actual IS NULL THEN cost_actual
                       ELSE COALESCE(cost_actual, 0) + :cost_actual END,
    finished_at = CASE WHEN :terminal THEN :now ELSE NULL END,
    updated_at = :now,
    lease_owner = CASE WHEN :keep_attempt THEN lease_owner END,
    -- a parked task's job has no lease: an orphan of it is named after the task
    lease_token = CASE WHEN :keep_attempt OR :orphan_until IS NOT NULL
                       THEN COALESCE(lease_token, 'orphan:' || id) END,
    lease_expires_at = CASE WHEN :keep_attempt THEN lease_expires_at ELSE :orphan_until END,
    cancel_requested = 0, parked = 0,
    upstream_request_id = COALESCE(:upstream_request_id, upstream_request_id),
    callback_state = CASE WHEN :terminal AND callback_url IS NOT NULL THEN 'pending'
                          ELSE callback_state END,
    callback_next_at = CASE WHEN :terminal AND callback_url IS NOT NULL THEN :now
                            ELSE callback_next_at END
WHERE id = :id AND status = :expected AND (:token IS NULL OR lease_token = :token)
  AND (:parked = 0 OR parked = 1)
RETURNING id, tenant, fingerprint, attempts;

-- name: attempt_of
SELECT id, status, lease_token FROM tasks WHERE id = :id;

-- name: attempts_of_ids
SELECT id, status, lease_token FROM tasks WHERE id IN (SELECT value FROM json_each(:ids));

-- name: close_attempt
UPDATE tasks SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    result = CASE WHEN :succeeded THEN :result ELSE result END, updated_at = :now,
    upstream_request_id = COALESCE(:upstream_request_id, upstream_request_id)
WHERE id = :id AND lease_token = :token
  AND status IN ('succeeded', 'failed', 'dead', 'timeout', 'cancelled', 'deduped')
RETURNING status, tenant, fingerprint;

-- name: orphan_attempt
UPDATE tasks SET lease_owner = NULL, lease_expires_at = :until, updated_at = :now
WHERE id = :id AND lease_token = :token;

-- All the leases of one heartbeat in one statement; the ones not returned are lost. A task
-- that ended under its lease (cancelled or past its deadline mid-call) is reported as
-- cancelled: its handler may stop; its call is read to its end either way.
-- name: heartbeat
UPDATE tasks SET lease_expires_at = :expires_at, updated_at = :now
FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.token') AS token
      FROM json_each(:rows)) AS held
WHERE tasks.id = held.id AND tasks.lease_token = held.token AND tasks.lease_owner IS NOT NULL
RETURNING id, cancel_requested OR status <> 'running' AS cancel_requested;

-- name: set_upstream_ref
UPDATE tasks SET upstream_ref = :ref, updated_at = :now
WHERE id = :id AND status = 'running' AND lease_token = :token;

-- name: cancel_now
UPDATE tasks SET status = 'cancelled', error = :error, finished_at = :now, updated_at = :now,
    waits_for = NULL,
    callback_state = CASE WHEN callback_url IS NOT NULL THEN 'pending' ELSE callback_state END,
    callback_next_at = CASE WHEN callback_url IS NOT NULL THEN :now ELSE callback_next_at END
WHERE id = :id AND status = :expected
RETURNING id;

-- A parked task's poll falls due at once: the poller cancels its upstream job now, not at the
-- next poll (which may be a minute away).
-- name: request_cancel_running
UPDATE tasks SET cancel_requested = 1, updated_at = :now,
    next_attempt_at = CASE WHEN parked = 1 THEN :now ELSE next_attempt_at END
WHERE id = :id AND status = 'running';

-- name: manual_retry
UPDATE tasks SET status = 'queued', attempts = 0, invalid_outputs = 0, result = NULL,
    error = NULL, waits_for = NULL, duplicate_of = NULL, callback_state = NULL,
    callback_attempts = 0, poll_attempts = 0, finished_at = NULL, next_attempt_at = :now,
    updated_at = :now,
    deadline_at = CASE WHEN deadline_at IS NULL THEN NULL
                       ELSE :now + (deadline_at - created_at) END
WHERE id = :id AND status = :expected
RETURNING id;

-- -- upstream jobs and callbacks --------------------------------------------------------------

-- A task whose batch line ended while it was being polled is due at once: the batch's end
-- woke only the tasks parked then, and this poll read the line before it ended.
-- name: park
UPDATE tasks SET parked = 1, upstream_ref = :ref,
    next_attempt_at = CASE WHEN EXISTS (
        SELECT 1 FROM upstream_lines l
        WHERE l.task_id = :id AND l.state IN (SELECT value FROM json_each(:ended_lines))
    ) THEN :now ELSE :poll_at END,
    poll_attempts = poll_attempts + :polled, lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = :now
WHERE id = :id AND status = 'running' AND lease_token = :token;

-- name: claim_parked
UPDATE tasks SET parked = 0, lease_owner = :owner, lease_token = :token,
    lease_expires_at = :expires_at, updated_at = :now
WHERE seq IN (
    SELECT seq FROM tasks
    WHERE status = 'running' AND parked = 1 AND next_attempt_at <= :now
      AND kind IN (SELECT value FROM json_each(:kinds))
    ORDER BY next_attempt_at LIMIT :limit)
RETURNING *;

-- name: next_parked_at
SELECT min(next_attempt_at) AS at FROM tasks WHERE status = 'running' AND parked = 1;

-- name: hasten_parked
UPDATE tasks SET next_attempt_at = :now
WHERE status = 'running' AND parked = 1 AND kind = :kind AND next_attempt_at > :now
  AND started_at <= :now - :older_than;

-- name: find_upstream
SELECT * FROM tasks WHERE kind = :kind AND upstream_ref = :ref LIMIT 1;

-- name: due_callbacks
SELECT * FROM tasks WHERE callback_state = 'pending' AND callback_next_at <= :now
ORDER BY callback_next_at LIMIT :limit;

-- name: callback_result
UPDATE tasks SET callback_state = :state, callback_attempts = callback_attempts + 1,
    callback_next_at = :next_at
WHERE id = :id AND callback_state = 'pending';

-- A completion's effects, in its transaction (migration 011).
-- name: insert_effects
INSERT INTO effects (task_id, effect, due_at)
SELECT json_extract(value, '$.task_id'), json_extract(value, '$.effect'), :now
FROM json_each(:rows);

-- name: due_effects
SELECT e.seq AS effect_seq, e.effect, e.attempts AS effect_attempts, t.*
FROM effects e JOIN tasks t ON t.id = e.task_id
WHERE e.due_at <= :now ORDER BY e.due_at LIMIT :limit;

-- name: effect_done
DELETE FROM effects WHERE seq = :seq;

-- name: effect_retry
UPDATE effects SET attempts = attempts + 1, due_at = :due_at WHERE seq = :seq;

-- -- recovery and maintenance -----------------------------------------------------------------

-- name: open_attempts
SELECT * FROM tasks WHERE lease_token IS NOT NULL OR (status = 'running' AND parked = 1)
ORDER BY lease_expires_at LIMIT :limit;

-- name: lease_owners
SELECT DISTINCT lease_owner FROM tasks
WHERE lease_token IS NOT NULL AND lease_owner IS NOT NULL;

-- name: expired_leases
SELECT * FROM tasks INDEXED BY tasks_attempts
WHERE lease_token IS NOT NULL AND lease_owner IS NOT NULL AND lease_expires_at < :now
ORDER BY lease_expires_at LIMIT :limit;

-- name: attempts_of
SELECT * FROM tasks
WHERE lease_token IS NOT NULL AND lease_owner IN (SELECT value FROM json_each(:owners))
ORDER BY lease_expires_at LIMIT :limit;

-- name: ended_orphans
SELECT * FROM tasks INDEXED BY tasks_attempts
WHERE lease_token IS NOT NULL AND lease_owner IS NULL AND lease_expires_at < :now
ORDER BY lease_expires_at LIMIT :limit;

-- name: past_deadline
SELECT * FROM tasks INDEXED BY tasks_deadlines  -- not the status index: every queued task
WHERE status IN ('queued', 'running', 'retrying') AND deadline_at IS NOT NULL
  AND deadline_at < :now
ORDER BY deadline_at LIMIT :limit;

-- name: purge_results
UPDATE tasks SET result = NULL, error = NULL
WHERE finished_at IS NOT NULL AND finished_at < :before
  AND (result IS NOT NULL OR error IS NOT NULL);

-- name: purge_fingerprints
DELETE FROM fingerprints WHERE state = 'succeeded' AND updated_at < :before;

-- name: purge_rows
DELETE FROM tasks WHERE finished_at IS NOT NULL AND finished_at < :before
  AND status IN ('succeeded', 'failed', 'dead', 'timeout', 'cancelled', 'deduped')
  AND lease_token IS NULL;

-- name: purge_events
DELETE FROM task_events WHERE at < :before;

-- name: purge_keys
DELETE FROM request_keys WHERE expires_at < :now;

-- name: try_lead
INSERT INTO leaders (name, owner, expires_at) VALUES (:name, :owner, :expires_at)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
WHERE leaders.owner = excluded.owner OR leaders.expires_at < :now
RETURNING owner;

-- name: leader
SELECT owner, expires_at FROM leaders WHERE name = :name;

-- name: take_lead
UPDATE leaders SET owner = :owner, expires_at = :expires_at
WHERE name = :name AND owner = :dead;

-- A dead process's leases: free at once, not when they expire.
-- name: drop_leases
DELETE FROM leaders WHERE substr(owner, 1, length(:prefix)) = :prefix;

-- -- reading ----------------------------------------------------------------------------------

-- -- spend and budgets -----------------------------------------------------------------------

-- name: lock_tenant_budget
SELECT :tenant;

-- What a tenant spent since a period began, and what its unfinished tasks may still cost,
-- read in one statement (one snapshot: a task that ends between two reads would be in
-- neither).
-- name: budget_used
SELECT (SELECT COALESCE(sum(cost), 0) FROM spend WHERE tenant = :tenant AND at >= :since)
           AS spent,
       (SELECT COALESCE(sum(spend_hold), 0) FROM tasks
        WHERE tenant = :tenant AND spend_hold > 0
          AND (status IN ('queued', 'running', 'retrying') OR lease_token IS NOT NULL)) AS held;

-- name: insert_spend
INSERT INTO spend (task_id, tenant, kind, at, cost, input_tokens, output_tokens, images,
                   over_estimate, tier, tier_saved, possibly)
SELECT t.id, t.tenant, t.kind, :at, json_extract(g.value, '$.cost'),
       json_extract(g.value, '$.input_tokens'), json_extract(g.value, '$.output_tokens'),
       json_extract(g.value, '$.images'), max(0, json_extract(g.value, '$.cost') - t.spend_hold),
       json_extract(g.value, '$.tier'), json_extract(g.value, '$.tier_saved'),
       json_extract(g.value, '$.possibly')
FROM json_each(:rows) AS g JOIN tasks t ON t.id = json_extract(g.value, '$.task_id');

-- name: note_over_estimate
UPDATE tasks SET over_estimate = over_estimate + (
    SELECT sum(max(0, json_extract(g.value, '$.cost') - tasks.spend_hold))
    FROM json_each(:rows) AS g WHERE json_extract(g.value, '$.task_id') = tasks.id)
WHERE id IN (SELECT json_extract(g.value, '$.task_id') FROM json_each(:rows) AS g)
  AND spend_hold < (SELECT max(json_extract(g.value, '$.cost')) FROM json_each(:rows) AS g
                    WHERE json_extract(g.value, '$.task_id') = tasks.id);

-- A deduped task saved what its source's work cost.
-- name: insert_saved
INSERT INTO spend (task_id, tenant, kind, at, deduped, saved)
SELECT t.id, t.tenant, t.kind, :at, 1,
       (SELECT COALESCE(sum(s.cost), 0) FROM spend s
        WHERE s.task_id = json_extract(g.value, '$.source'))
FROM json_each(:rows) AS g JOIN tasks t ON t.id = json_extract(g.value, '$.task_id');

-- name: spend_totals
SELECT tenant, kind, sum(cost) AS cost, sum(saved) AS saved,
       sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
       sum(images) AS images, sum(over_estimate) AS over_estimate,
       sum(1 - deduped) AS calls, sum(deduped) AS deduped, sum(tier_saved) AS tier_saved
FROM spend
WHERE (:tenant IS NULL OR tenant = :tenant) AND (:kind IS NULL OR kind = :kind)
  AND at >= :since
GROUP BY tenant, kind ORDER BY tenant, kind;

-- name: spend_series
SELECT CAST(at / :bucket AS INTEGER) * :bucket AS at, tenant, kind,
       sum(cost) AS cost, sum(saved) AS saved
FROM spend
WHERE (:tenant IS NULL OR tenant = :tenant) AND (:kind IS NULL OR kind = :kind)
  AND at >= :since
GROUP BY 1, tenant, kind ORDER BY 1, tenant, kind;

-- name: purge_spend
DELETE FROM spend WHERE at < :before;

-- name: stats
SELECT kind, status, count(*) AS count FROM tasks
WHERE :tenant IS NULL OR tenant = :tenant
GROUP BY kind, status;

-- name: list_tasks
SELECT * FROM tasks
WHERE (:tenant IS NULL OR tenant = :tenant) AND (:status IS NULL OR status = :status)
  AND (:kind IS NULL OR kind = :kind) AND (:lane IS NULL OR lane = :lane)
  AND (:batch_id IS NULL OR batch_id = :batch_id) AND seq > :after_seq
ORDER BY seq LIMIT :limit;

-- name: list_tasks_desc
SELECT * FROM tasks
WHERE (:tenant IS NULL OR tenant = :tenant) AND (:status IS NULL OR status = :status)
  AND (:kind IS NULL OR kind = :kind) AND (:lane IS NULL OR lane = :lane)
  AND (:batch_id IS NULL OR batch_id = :batch_id) AND seq < :before_seq
ORDER BY seq DESC LIMIT :limit;

-- name: recent_timings
SELECT id, kind, status, json_extract(error, '$.type') AS error_type, attempts, created_at,
       started_at, finished_at
FROM tasks WHERE :tenant IS NULL OR tenant = :tenant
ORDER BY seq DESC LIMIT :limit;

-- name: batch_counts
SELECT status, count(*) AS count FROM tasks
WHERE batch_id = :batch_id AND (:tenant IS NULL OR tenant = :tenant)
GROUP BY status;

-- name: worker_beat
INSERT INTO workers (owner, host, pid, concurrency, kinds, started_at, heartbeat_at)
VALUES (:owner, :host, :pid, :concurrency, :kinds, :started_at, :now)
ON CONFLICT (owner) DO UPDATE SET heartbeat_at = excluded.heartbeat_at;

-- name: drop_stale_workers
DELETE FROM workers WHERE heartbeat_at < :stale;

-- name: worker_gone
DELETE FROM workers WHERE owner = :owner;

-- name: list_workers
SELECT owner, host, pid, concurrency, kinds, started_at, heartbeat_at FROM workers
WHERE heartbeat_at >= :since ORDER BY host, pid, owner;

-- name: worker_tasks
-- The tasks whose lease a listed worker holds: its calls in flight.
SELECT t.lease_owner, t.id, t.kind, t.tenant, t.attempts, t.attempt_at FROM tasks t
JOIN workers w ON t.lease_owner = w.owner
WHERE t.lease_token IS NOT NULL AND w.heartbeat_at >= :since
ORDER BY t.attempt_at, t.seq;

-- name: list_batches
-- A tenant's newest batches (by their newest task), each one's tasks per status.
WITH newest AS (
    SELECT batch_id, max(seq) AS last_seq, min(created_at) AS created_at FROM tasks
    WHERE tenant = :tenant AND batch_id IS NOT NULL
    GROUP BY batch_id ORDER BY max(seq) DESC LIMIT :limit
)
SELECT n.batch_id, n.created_at, n.last_seq, t.status, count(*) AS count
FROM newest n JOIN tasks t ON t.batch_id = n.batch_id AND t.tenant = :tenant
GROUP BY n.batch_id, n.created_at, n.last_seq, t.status
ORDER BY n.last_seq DESC;

-- name: note_request_id
UPDATE tasks SET upstream_request_id = :upstream_request_id WHERE id = :id;

-- name: append_stream
INSERT INTO stream_events (task_id, seq, data, at)
SELECT :task_id, :first + key, value, :now FROM json_each(:events) WHERE true
ON CONFLICT (task_id, seq) DO NOTHING;

-- name: read_stream
SELECT seq, data FROM stream_events WHERE task_id = :task_id AND seq > :after
ORDER BY seq LIMIT :limit;

-- name: purge_streams
DELETE FROM stream_events WHERE at < :before;

-- name: forget_result
UPDATE tasks SET result = NULL
WHERE id = :id AND tenant = :tenant AND finished_at IS NOT NULL;

-- name: forget_stream
DELETE FROM stream_events WHERE task_id = :id;

-- name: keep_server_key
INSERT INTO server_keys (name, value) VALUES (:name, :value) ON CONFLICT (name) DO NOTHING;

-- name: server_key
SELECT value FROM server_keys WHERE name = :name;
