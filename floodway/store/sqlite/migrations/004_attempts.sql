-- An attempt is open while its task's row holds a lease token: its call may be running at the
-- provider. It is usually the task's running attempt; it can outlive the task's status (a
-- deadline passed mid-call: the call goes on, and its late success is kept for the work), and
-- its worker (lease_owner NULL: the worker died mid-call; lease_expires_at is then when the
-- call will have ended at the latest).
ALTER TABLE tasks ADD COLUMN attempt_at REAL;
DROP INDEX tasks_leases;
CREATE INDEX tasks_attempts ON tasks (lease_expires_at) WHERE lease_token IS NOT NULL;
CREATE INDEX tasks_attempt_owners ON tasks (lease_owner) WHERE lease_token IS NOT NULL;
