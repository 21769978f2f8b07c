-- Provider batches and their lines (floodway/store/tier_records.py). States are parameters.

-- name: insert_line
INSERT INTO upstream_lines (task_id, kind, model, body, state, added_at, deadline_at,
                            updated_at)
VALUES (:task_id, :kind, :model, :body, :state, :now, :deadline_at, :now)
ON CONFLICT (task_id) DO NOTHING;

-- name: get_line
SELECT * FROM upstream_lines WHERE task_id = :task_id;

-- name: requeue_line
UPDATE upstream_lines SET state = :queued, batch_id = NULL, result = NULL, error = NULL,
    error_type = NULL, fatal = 0, input_tokens = 0, output_tokens = 0, added_at = :now,
    updated_at = :now
WHERE task_id = :task_id AND state IN (SELECT value FROM json_each(:from_states));

-- name: set_task_tier
UPDATE tasks SET tier = :tier WHERE id = :id;

-- name: line_pools
SELECT kind, model, count(*) AS lines, min(added_at) AS oldest, min(deadline_at) AS due
FROM upstream_lines WHERE state = :queued GROUP BY kind, model;

-- name: queued_lines_due
SELECT * FROM upstream_lines
WHERE state = :queued AND kind = :kind AND deadline_at IS NOT NULL AND deadline_at <= :by;

-- name: insert_upstream_batch
INSERT INTO upstream_batches (id, kind, model, state, created_at)
VALUES (:id, :kind, :model, :state, :now);

-- A queued line whose task has ended (a cancel, a deadline or a timeout between the line's
-- queuing and the task's park on it) is never sent: nobody would take its answer or record
-- what it billed. Deleted, not withdrawn: a manual retry of the task queues it again.
-- Each queued line's task looked up by id, not a list of every task that ever ended.
-- name: drop_ended_lines
DELETE FROM upstream_lines
WHERE kind = :kind AND model = :model AND state = :queued
  AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = upstream_lines.task_id
              AND t.status IN (SELECT value FROM json_each(:ended)));

-- The outer state test: a line withdrawn meanwhile (PostgreSQL re-reads a row it waited
-- for) stays withdrawn, never sent.
-- name: pack_lines
UPDATE upstream_lines SET state = :sent, batch_id = :batch_id, updated_at = :now
WHERE task_id IN (
    SELECT task_id FROM upstream_lines
    WHERE kind = :kind AND model = :model AND state = :queued
    ORDER BY added_at, task_id LIMIT :limit)
  AND state = :queued;

-- name: count_batch_lines
UPDATE upstream_batches SET lines = (SELECT count(*) FROM upstream_lines WHERE batch_id = :id)
WHERE id = :id;

-- name: batch_lines
SELECT * FROM upstream_lines WHERE batch_id = :batch_id ORDER BY added_at, task_id;

-- name: open_upstream_batches
SELECT * FROM upstream_batches WHERE state IN (:creating, :sent) ORDER BY created_at, id;

-- name: sent_upstream_batch
UPDATE upstream_batches SET state = :sent, provider_id = :provider_id, sent_at = :now
WHERE id = :id AND state = :creating;

-- name: recorded_provider_ids
SELECT provider_id FROM upstream_batches
WHERE provider_id IN (SELECT value FROM json_each(:ids));

-- name: end_line
UPDATE upstream_lines SET state = :state, result = :result, input_tokens = :input_tokens,
    output_tokens = :output_tokens, error = :error, error_type = :error_type, fatal = :fatal,
    updated_at = :now
WHERE task_id = :task_id AND batch_id = :batch_id AND state = :sent;

-- name: withdraw_batch_rest
UPDATE upstream_lines SET state = :withdrawn, updated_at = :now
WHERE batch_id = :batch_id AND state = :sent;

-- name: withdraw_queued
UPDATE upstream_lines SET state = :withdrawn, updated_at = :now
WHERE task_id IN (SELECT value FROM json_each(:ids)) AND state = :queued;

-- A batch's turnaround is recorded when it completed (NULL otherwise: a cancelled or failed
-- batch says nothing of how long a whole one takes).
-- name: end_upstream_batch
UPDATE upstream_batches SET state = :ended, ended_at = :now,
    turnaround = :turnaround
WHERE id = :id;

-- Each kind's most recent completed batches' turnarounds, the oldest first.
-- name: learned_turnarounds
SELECT kind, turnaround FROM (
    SELECT kind, turnaround, ended_at,
           row_number() OVER (PARTITION BY kind ORDER BY ended_at DESC) AS n
    FROM upstream_batches WHERE turnaround IS NOT NULL) recent
WHERE n <= :recent
ORDER BY kind, ended_at;

-- A line's task is polled at once once the line has an answer (it is parked on it).
-- name: wake_line_tasks
UPDATE tasks SET next_attempt_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'running' AND parked = 1
  AND next_attempt_at > :now;

-- Ended lines expire with results ([retention] results): their tasks hold their answers.
-- name: purge_lines
DELETE FROM upstream_lines
WHERE updated_at < :before AND state IN (SELECT value FROM json_each(:ended_states));

-- name: purge_upstream_batches
DELETE FROM upstream_batches WHERE state = :ended AND ended_at < :before;

-- A task's line, locked: whoever takes it out or packs it decides alone.
-- name: lock_line
SELECT state FROM upstream_lines WHERE task_id = :task_id;

-- A task waiting for this work that would not go on the batch tier itself (core/tiers.py's
-- rule): interactive, pinned to a faster tier, or due before a batch could answer.
-- name: waiter_needs_sooner
SELECT w.id FROM tasks w
WHERE w.waits_for = :id AND +w.status = 'queued'
  AND (w.lane = 'interactive' OR w.tier IN (SELECT value FROM json_each(:faster))
       OR (w.tier IS NULL AND w.deadline_at < :batch_by))
LIMIT 1;

-- The work of a task whose line was never sent goes back to the queue at once, on the sync
-- tier, its attempt given back (no call was made); whoever held it (a poll, a worker about to
-- park it) loses its lease.
-- name: take_off_batch
UPDATE tasks SET status = 'retrying', tier = :sync, next_attempt_at = :now,
    attempts = max(attempts - 1, 0), parked = 0, lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = :now
WHERE id = :id AND status = 'running'
RETURNING tenant, attempts;
