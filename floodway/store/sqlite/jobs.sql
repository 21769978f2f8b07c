-- Multi-step jobs' statements (the rules are store/rules.py's: submit_job, advance_job,
-- cancel_job, retry_job).

-- name: insert_job
INSERT INTO jobs (id, tenant, status, lane, spec, deadline_s, deadline_at, metadata,
                  callback_url, created_at, updated_at)
VALUES (:id, :tenant, 'running', :lane, :spec, :deadline_s, :deadline_at, :metadata,
        :callback_url, :now, :now);

-- name: get_job
SELECT * FROM jobs WHERE id = :id;

-- name: lock_job
SELECT * FROM jobs WHERE id = :id;

-- A job's tasks and where each stands (a purged task is gone from the view).
-- name: job_tasks
SELECT jt.step, jt.idx, jt.task_id, t.status, t.result, t.error
FROM job_tasks jt JOIN tasks t ON t.id = jt.task_id
WHERE jt.job_id = :job_id;

-- name: job_sizes
SELECT step, size FROM job_steps WHERE job_id = :job_id;

-- name: insert_job_step
INSERT INTO job_steps (job_id, step, size, started_at) VALUES (:job_id, :step, :size, :now);

-- name: insert_job_task
INSERT INTO job_tasks (task_id, job_id, step, idx) VALUES (:task_id, :job_id, :step, :idx);

-- name: replace_job_task
UPDATE job_tasks SET task_id = :new_task_id WHERE task_id = :task_id;

-- The jobs some ended tasks belong to (most tasks belong to none: one look-up by key).
-- name: jobs_of_tasks
SELECT DISTINCT job_id FROM job_tasks WHERE task_id IN (SELECT value FROM json_each(:ids))
ORDER BY job_id;

-- name: jobs_ended
SELECT id FROM jobs WHERE id IN (SELECT value FROM json_each(:ids)) AND status <> 'running';

-- name: end_job
UPDATE jobs SET status = :status, result = :result, error = :error, finished_at = :now,
    updated_at = :now,
    callback_state = CASE WHEN callback_url IS NULL THEN NULL ELSE 'pending' END,
    callback_attempts = 0, callback_next_at = :now
WHERE id = :id AND status = 'running';

-- name: reopen_job
UPDATE jobs SET status = 'running', result = NULL, error = NULL, finished_at = NULL,
    callback_state = NULL, callback_next_at = NULL, updated_at = :now,
    deadline_at = CASE WHEN deadline_s IS NULL THEN NULL ELSE :now + deadline_s END
WHERE id = :id AND status = 'failed';

-- name: list_jobs
SELECT * FROM jobs
WHERE tenant = :tenant AND (:status IS NULL OR status = :status)
  AND (:after IS NULL OR seq > :after)
ORDER BY seq LIMIT :limit;

-- name: list_jobs_desc
SELECT * FROM jobs
WHERE tenant = :tenant AND (:status IS NULL OR status = :status)
  AND (:after IS NULL OR seq < :after)
ORDER BY seq DESC LIMIT :limit;

-- name: due_job_callbacks
SELECT * FROM jobs WHERE callback_state = 'pending' AND callback_next_at <= :now
ORDER BY callback_next_at LIMIT :limit;

-- name: job_callback_result
UPDATE jobs SET callback_state = :state, callback_attempts = callback_attempts + 1,
    callback_next_at = :next_at
WHERE id = :id AND callback_state = 'pending';

-- name: purge_job_tasks
DELETE FROM job_tasks WHERE job_id IN (SELECT id FROM jobs WHERE finished_at < :before);

-- name: purge_job_steps
DELETE FROM job_steps WHERE job_id IN (SELECT id FROM jobs WHERE finished_at < :before);

-- name: purge_jobs
DELETE FROM jobs WHERE finished_at < :before;
