-- Provider batches and their lines (floodway/store/tier_records.py). States are parameters.

-- name: insert_line
INSERT INTO upstream_lines (task_id, kind, model, body, state, added_at, deadline_at,
                            updated_at)
VALUES (%(task_id)s, %(kind)s, %(model)s, %(body)s, %(state)s, %(now)s, %(deadline_at)s::double precision, %(now)s)
ON CONFLICT (task_id) DO NOTHING;

-- name: get_line
SELECT * FROM upstream_lines WHERE task_id = %(task_id)s;

-- name: requeue_line
UPDATE upstream_lines SET state = %(queued)s, batch_id = NULL, result = NULL, error = NULL,
    error_type = NULL, fatal = false, input_tokens = 0, output_tokens = 0, added_at = %(now)s,
    updated_at = %(now)s
WHERE task_id = %(task_id)s AND state = ANY(%(from_states)s::text[]);

-- name: set_task_tier
UPDATE tasks SET tier = %(tier)s WHERE id = %(id)s;

-- name: line_pools
SELECT kind, model, count(*) AS lines, min(added_at) AS oldest, min(deadline_at) AS due
FROM upstream_lines WHERE state = %(queued)s GROUP BY kind, model;

-- name: queued_lines_due
SELECT * FROM upstream_lines
WHERE state = %(queued)s AND kind = %(kind)s AND deadline_at IS NOT NULL AND deadline_at <= %(by)s;

-- name: insert_upstream_batch
INSERT INTO upstream_batches (id, kind, model, state, created_at)
VALUES (%(id)s, %(kind)s, %(model)s, %(state)s, %(now)s);

-- A queued line whose task has ended (a cancel, a deadline or a timeout between the line's
-- queuing and the task's park on it) is never sent: nobody would take its answer or record
-- what it billed. Deleted, not withdrawn: a manual retry of the task queues it again.
-- Each queued line's task looked up by id, not a list of every task that ever ended.
-- name: drop_ended_lines
DELETE FROM upstream_lines
WHERE kind = %(kind)s AND model = %(model)s AND state = %(queued)s
  AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = upstream_lines.task_id
              AND t.status = ANY(%(ended)s::text[]));

-- The outer state test: a line withdrawn meanwhile (PostgreSQL re-reads a row it waited
-- for) stays withdrawn, never sent.
-- name: pack_lines
UPDATE upstream_lines SET state = %(sent)s, batch_id = %(batch_id)s, updated_at = %(now)s
WHERE task_id IN (
    SELECT task_id FROM upstream_lines
    WHERE kind = %(kind)s AND model = %(model)s AND state = %(queued)s
    ORDER BY added_at, task_id LIMIT %(limit)s)
  AND state = %(queued)s;

-- name: count_batch_lines
UPDATE upstream_batches SET lines = (SELECT count(*) FROM upstream_lines WHERE batch_id = %(id)s)
WHERE id = %(id)s;

-- name: batch_lines
SELECT * FROM upstream_lines WHERE batch_id = %(batch_id)s ORDER BY added_at, task_id;

-- name: open_upstream_batches
SELECT * FROM upstream_batches WHERE state IN (%(creating)s, %(sent)s) ORDER BY created_at, id;

-- name: sent_upstream_batch
UPDATE upstream_batches SET state = %(sent)s, provider_id = %(provider_id)s, sent_at = %(now)s
WHERE id = %(id)s AND state = %(creating)s;

-- name: recorded_provider_ids
SELECT provider_id FROM upstream_batches WHERE provider_id = ANY(%(ids)s::text[]);

-- name: end_line
UPDATE upstream_lines SET state = %(state)s, result = %(result)s::text, input_tokens = %(input_tokens)s,
    output_tokens = %(output_tokens)s, error = %(error)s::text, error_type = %(error_type)s::text, fatal = %(fatal)s::boolean,
    updated_at = %(now)s
WHERE task_id = %(task_id)s AND batch_id = %(batch_id)s AND state = %(sent)s;

-- name: withdraw_batch_rest
UPDATE upstream_lines SET state = %(withdrawn)s, updated_at = %(now)s
WHERE batch_id = %(batch_id)s AND state = %(sent)s;

-- name: withdraw_queued
UPDATE upstream_lines SET state = %(withdrawn)s, updated_at = %(now)s
WHERE task_id = ANY(%(ids)s::text[]) AND state = %(queued)s;

-- A batch's turnaround is recorded when it completed (NULL otherwise: a cancelled or failed
-- batch says nothing of how long a whole one takes).
-- name: end_upstream_batch
UPDATE upstream_batches SET state = %(ended)s, ended_at = %(now)s,
    turnaround = %(turnaround)s::double precision
WHERE id = %(id)s;

-- Each kind's most recent completed batches' turnarounds, the oldest first.
-- name: learned_turnarounds
SELECT kind, turnaround FROM (
    SELECT kind, turnaround, ended_at,
           row_number() OVER (PARTITION BY kind ORDER BY ended_at DESC) AS n
    FROM upstream_batches WHERE turnaround IS NOT NULL) recent
WHERE n <= %(recent)s
ORDER BY kind, ended_at;

-- A line's task is polled at once once the line has an answer (it is parked on it).
-- name: wake_line_tasks
UPDATE tasks SET next_attempt_at = %(now)s
WHERE id = ANY(%(ids)s::text[]) AND status = 'running' AND parked
  AND next_attempt_at > %(now)s;

-- Ended lines expire with results ([retention] results): their tasks hold their answers.
-- name: purge_lines
DELETE FROM upstream_lines
WHERE updated_at < %(before)s AND state = ANY(%(ended_states)s::text[]);

-- name: purge_upstream_batches
DELETE FROM upstream_batches WHERE state = %(ended)s AND ended_at < %(before)s;

-- A task's line, locked: whoever takes it out or packs it decides alone.
-- name: lock_line
SELECT state FROM upstream_lines WHERE task_id = %(task_id)s FOR UPDATE;

-- A task waiting for this work that would not go on the batch tier itself (core/tiers.py's
-- rule): interactive, pinned to a faster tier, or due before a batch could answer.
-- name: waiter_needs_sooner
SELECT w.id FROM tasks w
WHERE w.waits_for = %(id)s AND w.status = 'queued'
  AND (w.lane = 'interactive' OR w.tier = ANY(%(faster)s::text[])
       OR (w.tier IS NULL AND w.deadline_at < %(batch_by)s))
LIMIT 1;

-- The work of a task whose line was never sent goes back to the queue at once, on the sync
-- tier, its attempt given back (no call was made); whoever held it (a poll, a worker about to
-- park it) loses its lease.
-- name: take_off_batch
UPDATE tasks SET status = 'retrying', tier = %(sync)s, next_attempt_at = %(now)s,
    attempts = GREATEST(attempts - 1, 0), parked = false, lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = %(now)s
WHERE id = %(id)s AND status = 'running'
RETURNING tenant, attempts;
