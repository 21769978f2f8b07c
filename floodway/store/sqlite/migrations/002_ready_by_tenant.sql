-- Admission control lists each tenant's first ready tasks (so one tenant's big batch does
-- not hide another's): walk tenants with a skip-scan, then each one's queue in order.
CREATE INDEX tasks_ready_tenant ON tasks (tenant, lane_rank, next_attempt_at, seq)
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL;
