-- Dispatch order is lane, then age (seq): a task due again after a retry goes ahead of younger
-- tasks instead of behind everything queued before it became due, so retries do not pile up
-- in a batch's last wave while the provider's slots sit idle.
DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (lane_rank, seq)
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL;
DROP INDEX tasks_ready_tenant;
CREATE INDEX tasks_ready_tenant ON tasks (tenant, lane_rank, seq)
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL;
