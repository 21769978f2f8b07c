-- Multi-step jobs (docs/jobs.md). A job's steps run as ordinary tasks: job_tasks says which
-- step (and which item of a for_each) each task is, job_steps which steps have started and
-- how many tasks each has. The next steps are written in the transaction that ends the task
-- they wait for, so no crash leaves a job between two steps.
CREATE TABLE jobs (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT NOT NULL UNIQUE,
    tenant            TEXT NOT NULL,
    status            TEXT NOT NULL,
    lane              TEXT NOT NULL,
    spec              TEXT NOT NULL,
    deadline_s        REAL,
    deadline_at       REAL,
    metadata          TEXT NOT NULL DEFAULT '{}',
    callback_url      TEXT,
    -- the outbox for callback_url, as a task's: 'pending' from the job's end on
    callback_state    TEXT,
    callback_attempts INTEGER NOT NULL DEFAULT 0,
    callback_next_at  REAL,
    result            TEXT,
    error             TEXT,
    created_at        REAL NOT NULL,
    updated_at        REAL NOT NULL,
    finished_at       REAL
);
CREATE INDEX jobs_by_tenant ON jobs (tenant, seq);
CREATE INDEX jobs_callbacks ON jobs (callback_next_at) WHERE callback_state = 'pending';
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE job_steps (
    job_id     TEXT NOT NULL,
    step       TEXT NOT NULL,
    size       INTEGER NOT NULL,
    started_at REAL NOT NULL,
    PRIMARY KEY (job_id, step)
);

CREATE TABLE job_tasks (
    task_id TEXT PRIMARY KEY,
    job_id  TEXT NOT NULL,
    step    TEXT NOT NULL,
    idx     INTEGER NOT NULL
);
CREATE UNIQUE INDEX job_tasks_by_step ON job_tasks (job_id, step, idx);
