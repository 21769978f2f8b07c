-- Multi-step jobs' statements (the rules are store/rules.py's: submit_job, advance_job,
-- cancel_job, retry_job).

-- name: insert_job
INSERT INTO jobs (id, tenant, status, lane, spec, deadline_s, deadline_at, metadata,
                  callback_url, created_at, updated_at)
VALUES (%(id)s, %(tenant)s, 'running', %(lane)s, %(spec)s, %(deadline_s)s, %(deadline_at)s, %(metadata)s,
        %(callback_url)s, %(now)s, %(now)s);

-- name: get_job
SELECT * FROM jobs WHERE id = %(id)s;

-- name: lock_job
SELECT * FROM jobs WHERE id = %(id)s FOR UPDATE;

-- A job's tasks and where each stands (a purged task is gone from the view).
-- name: job_tasks
SELECT jt.step, jt.idx, jt.task_id, t.status, t.result, t.error
FROM job_tasks jt JOIN tasks t ON t.id = jt.task_id
WHERE jt.job_id = %(job_id)s;

-- name: job_sizes
SELECT step, size FROM job_steps WHERE job_id = %(job_id)s;

-- name: insert_job_step
INSERT INTO job_steps (job_id, step, size, started_at) VALUES (%(job_id)s, %(step)s, %(size)s, %(now)s);

-- name: insert_job_task
INSERT INTO job_tasks (task_id, job_id, step, idx) VALUES (%(task_id)s, %(job_id)s, %(step)s, %(idx)s);

-- name: replace_job_task
UPDATE job_tasks SET task_id = %(new_task_id)s WHERE task_id = %(task_id)s;

-- The jobs some ended tasks belong to (most tasks belong to none: one look-up by key).
-- name: jobs_of_tasks
SELECT DISTINCT job_id FROM job_tasks WHERE task_id = ANY(%(ids)s::text[])
ORDER BY job_id;

-- name: jobs_ended
SELECT id FROM jobs WHERE id = ANY(%(ids)s::text[]) AND status <> 'running';

-- name: end_job
UPDATE jobs SET status = %(status)s, result = %(result)s, error = %(error)s, finished_at = %(now)s,
    updated_at = %(now)s,
    callback_state = CASE WHEN callback_url IS NULL THEN NULL ELSE 'pending' END,
    callback_attempts = 0, callback_next_at = %(now)s
WHERE id = %(id)s AND status = 'running';

-- name: reopen_job
UPDATE jobs SET status = 'running', result = NULL, error = NULL, finished_at = NULL,
    callback_state = NULL, callback_next_at = NULL, updated_at = %(now)s,
    deadline_at = CASE WHEN deadline_s IS NULL THEN NULL ELSE %(now)s::double precision + deadline_s END
WHERE id = %(id)s AND status = 'failed';

-- name: list_jobs
SELECT * FROM jobs
WHERE tenant = %(tenant)s AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(after)s::bigint IS NULL OR seq > %(after)s::bigint)
ORDER BY seq LIMIT %(limit)s;

-- name: list_jobs_desc
SELECT * FROM jobs
WHERE tenant = %(tenant)s AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(after)s::bigint IS NULL OR seq < %(after)s::bigint)
ORDER BY seq DESC LIMIT %(limit)s;

-- name: due_job_callbacks
SELECT * FROM jobs WHERE callback_state = 'pending' AND callback_next_at <= %(now)s
ORDER BY callback_next_at LIMIT %(limit)s;

-- name: job_callback_result
UPDATE jobs SET callback_state = %(state)s, callback_attempts = callback_attempts + 1,
    callback_next_at = %(next_at)s
WHERE id = %(id)s AND callback_state = 'pending';

-- name: purge_job_tasks
DELETE FROM job_tasks WHERE job_id IN (SELECT id FROM jobs WHERE finished_at < %(before)s);

-- name: purge_job_steps
DELETE FROM job_steps WHERE job_id IN (SELECT id FROM jobs WHERE finished_at < %(before)s);

-- name: purge_jobs
DELETE FROM jobs WHERE finished_at < %(before)s;
