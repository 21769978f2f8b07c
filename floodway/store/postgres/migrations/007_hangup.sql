-- The hang-up rule (docs/guarantees.md). call_ends_by: when the attempt's call will have
-- ended at the provider at the latest, set when the attempt starts from what the kind's calls
-- have taken, so a process started after a crash knows it. spend.possibly: a row that records
-- an attempt whose outcome nobody saw, at its estimate (the ledger may over-state what the
-- provider billed, never under-state it). A task whose attempt is still open keeps its spend
-- hold against the budget, whatever its status.
ALTER TABLE tasks ADD COLUMN call_ends_by double precision;
ALTER TABLE spend ADD COLUMN possibly boolean NOT NULL DEFAULT false;
DROP INDEX tasks_held;
CREATE INDEX tasks_held ON tasks (tenant) INCLUDE (spend_hold)
    WHERE spend_hold > 0 AND (status IN ('queued', 'running', 'retrying') OR lease_token IS NOT NULL);
