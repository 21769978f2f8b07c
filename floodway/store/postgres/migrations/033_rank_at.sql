-- Dispatch order within a lane is rank_at, then seq. rank_at is the time of the submit the
-- task came from: its own, or its job's for a job's step (docs/jobs.md). A job's later steps
-- go ahead of work submitted after the job, so jobs flow through their chain instead of each
-- resource working through one step of every job before the next step of any.
ALTER TABLE tasks ADD COLUMN rank_at double precision;
UPDATE tasks SET rank_at = COALESCE(
    (SELECT j.created_at FROM job_tasks s JOIN jobs j ON j.id = s.job_id WHERE s.task_id = tasks.id),
    created_at);
ALTER TABLE tasks ALTER COLUMN rank_at SET NOT NULL;
DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (lane_rank, rank_at, seq)
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL;
DROP INDEX tasks_ready_tenant;
CREATE INDEX tasks_ready_tenant ON tasks (tenant, lane_rank, rank_at, seq)
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL;
