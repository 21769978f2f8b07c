-- The ledger of tasks, request keys, work fingerprints, status events and leader leases.
CREATE TABLE tasks (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    id               TEXT NOT NULL UNIQUE,
    kind             TEXT NOT NULL,
    status           TEXT NOT NULL,
    lane             TEXT NOT NULL,
    lane_rank        INTEGER NOT NULL,
    tenant           TEXT NOT NULL,
    input            TEXT NOT NULL,
    result           TEXT,
    error            TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    idempotency_key  TEXT,
    fingerprint      TEXT,
    duplicate_of     TEXT,
    waits_for        TEXT,
    upstream_ref     TEXT,
    cost_estimated   REAL NOT NULL DEFAULT 0,
    cost_actual      REAL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    started_at       REAL,
    finished_at      REAL,
    deadline_at      REAL,
    next_attempt_at  REAL NOT NULL,
    metadata         TEXT NOT NULL DEFAULT '{}',
    callback_url     TEXT,
    batch_id         TEXT,
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at REAL,
    invalid_outputs  INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    poll_attempts    INTEGER NOT NULL DEFAULT 0,
    -- running but waiting on an upstream job: no lease, no worker; woken at next_attempt_at
    parked           INTEGER NOT NULL DEFAULT 0,
    -- the outbox for callback_url: 'pending' from the terminal write on, then 'delivered'
    -- or 'failed'
    callback_state    TEXT,
    callback_attempts INTEGER NOT NULL DEFAULT 0,
    callback_next_at  REAL
);

-- The claim walks this index in dispatch order; it holds only claimable rows, so its cost
-- does not grow with the number of finished tasks.
CREATE INDEX tasks_ready ON tasks (lane_rank, next_attempt_at, seq)
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL;
CREATE INDEX tasks_parked ON tasks (next_attempt_at) WHERE status = 'running' AND parked = 1;
CREATE INDEX tasks_upstream ON tasks (kind, upstream_ref) WHERE upstream_ref IS NOT NULL;
CREATE INDEX tasks_callbacks ON tasks (callback_next_at) WHERE callback_state = 'pending';
CREATE INDEX tasks_leases ON tasks (lease_expires_at) WHERE status = 'running';
CREATE INDEX tasks_deadlines ON tasks (deadline_at)
    WHERE status IN ('queued', 'running', 'retrying') AND deadline_at IS NOT NULL;
CREATE INDEX tasks_waiters ON tasks (waits_for, seq) WHERE waits_for IS NOT NULL;
CREATE INDEX tasks_interactive ON tasks (tenant)
    WHERE lane = 'interactive' AND status IN ('queued', 'running', 'retrying');
CREATE INDEX tasks_tenant_seq ON tasks (tenant, seq);
CREATE INDEX tasks_status_seq ON tasks (status, seq);
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX tasks_batch ON tasks (batch_id, seq) WHERE batch_id IS NOT NULL;

CREATE TABLE request_keys (
    tenant       TEXT NOT NULL,
    key          TEXT NOT NULL,
    task_id      TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    expires_at   REAL NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX request_keys_expiry ON request_keys (expires_at);

-- One row per piece of work: which task owns it and whether its result exists.
CREATE TABLE fingerprints (
    fingerprint TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('inflight', 'succeeded')),
    updated_at  REAL NOT NULL
);

CREATE TABLE task_events (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    status  TEXT NOT NULL,
    at      REAL NOT NULL,
    attempt INTEGER NOT NULL,
    detail  TEXT NOT NULL DEFAULT ''
);
CREATE INDEX task_events_task ON task_events (task_id, seq);
CREATE INDEX task_events_at ON task_events (at);

CREATE TABLE leaders (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at REAL NOT NULL
);
