-- The spend ledger: one row per billed call (its usage and cost, written in the transaction
-- that records the call's outcome) and one per deduped task (what it saved: the cost of the
-- work it took the result of).
CREATE TABLE spend (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id       TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    kind          TEXT NOT NULL,
    at            REAL NOT NULL,
    cost          REAL NOT NULL DEFAULT 0,
    saved         REAL NOT NULL DEFAULT 0,
    input_tokens  REAL NOT NULL DEFAULT 0,
    output_tokens REAL NOT NULL DEFAULT 0,
    images        REAL NOT NULL DEFAULT 0
);
-- (tenant, at, cost): a budget check sums a period's spend from the index alone.
CREATE INDEX spend_tenant_at ON spend (tenant, at, cost);
CREATE INDEX spend_at ON spend (at);
CREATE INDEX spend_task ON spend (task_id);
-- What a task may still cost (its estimate, priced): held against its tenant's budget while
-- the task has not ended. The budget check sums the in-flight ones through this index.
ALTER TABLE tasks ADD COLUMN spend_hold REAL NOT NULL DEFAULT 0;
CREATE INDEX tasks_held ON tasks (tenant, spend_hold)
    WHERE spend_hold > 0 AND status IN ('queued', 'running', 'retrying');
