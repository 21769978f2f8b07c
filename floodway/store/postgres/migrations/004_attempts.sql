-- An attempt is open while its task's row holds a lease token: its call may be running at the
-- provider. It is usually the task's running attempt; it can outlive the task's status (a
-- deadline passed mid-call: the call goes on, and its late success is kept for the work), and
-- its worker (lease_owner NULL: the worker died mid-call; lease_expires_at is then when the
-- call will have ended at the latest).
ALTER TABLE tasks ADD COLUMN attempt_at double precision;
DROP INDEX tasks_leases;
CREATE INDEX tasks_attempts ON tasks (lease_expires_at) WHERE lease_token IS NOT NULL;
CREATE INDEX tasks_attempt_owners ON tasks (lease_owner) WHERE lease_token IS NOT NULL;

-- A process that holds its liveness lock (a session-level advisory lock, released by the
-- server when the session ends, however the process died) says since when, by the server's
-- clock: a free lock means death only for a process that held it since the server last
-- started (after a restart, every lock is free until its process connects again).
CREATE TABLE processes (
    identity  text PRIMARY KEY,
    locked_at double precision NOT NULL
);
