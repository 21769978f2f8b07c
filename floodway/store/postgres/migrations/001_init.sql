-- The ledger of tasks, request keys, work fingerprints, status events and leader leases.
-- Same tables, columns and partial indexes as the SQLite store; times are epoch seconds from
-- the engine's clock. JSON values are stored as text: byte-for-byte what the caller sent, so
-- both stores give back the same key order and accept the same strings (jsonb would reorder
-- keys and refuse \u0000).
CREATE TABLE tasks (
    seq              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id               text NOT NULL UNIQUE,
    kind             text NOT NULL,
    status           text NOT NULL,
    lane             text NOT NULL,
    lane_rank        integer NOT NULL,
    tenant           text NOT NULL,
    input            text NOT NULL,
    result           text,
    error            text,
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL,
    idempotency_key  text,
    fingerprint      text,
    duplicate_of     text,
    waits_for        text,
    upstream_ref     text,
    cost_estimated   double precision NOT NULL DEFAULT 0,
    cost_actual      double precision,
    created_at       double precision NOT NULL,
    updated_at       double precision NOT NULL,
    started_at       double precision,
    finished_at      double precision,
    deadline_at      double precision,
    next_attempt_at  double precision NOT NULL,
    metadata         text NOT NULL DEFAULT '{}',
    callback_url     text,
    batch_id         text,
    lease_owner      text,
    lease_token      text,
    lease_expires_at double precision,
    invalid_outputs  integer NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    poll_attempts    integer NOT NULL DEFAULT 0,
    -- running but waiting on an upstream job: no lease, no worker; woken at next_attempt_at
    parked           boolean NOT NULL DEFAULT false,
    -- the outbox for callback_url: 'pending' from the terminal write on, then 'delivered'
    -- or 'failed'
    callback_state    text,
    callback_attempts integer NOT NULL DEFAULT 0,
    callback_next_at  double precision
);

-- The claim walks this index in dispatch order; it holds only claimable rows, so its cost
-- does not grow with the number of finished tasks.
CREATE INDEX tasks_ready ON tasks (lane_rank, next_attempt_at, seq)
    WHERE status IN ('queued', 'retrying') AND waits_for IS NULL;
CREATE INDEX tasks_parked ON tasks (next_attempt_at) WHERE status = 'running' AND parked;
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
    tenant       text NOT NULL,
    key          text NOT NULL,
    task_id      text NOT NULL,
    request_hash text NOT NULL,
    expires_at   double precision NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX request_keys_expiry ON request_keys (expires_at);

-- One row per piece of work: which task owns it and whether its result exists. Its row lock
-- is what serializes a completing owner against a new submitter of the same work.
CREATE TABLE fingerprints (
    fingerprint text PRIMARY KEY,
    task_id     text NOT NULL,
    state       text NOT NULL CHECK (state IN ('inflight', 'succeeded')),
    updated_at  double precision NOT NULL
);

CREATE TABLE task_events (
    seq     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id text NOT NULL,
    status  text NOT NULL,
    at      double precision NOT NULL,
    attempt integer NOT NULL,
    detail  text NOT NULL DEFAULT ''
);
CREATE INDEX task_events_task ON task_events (task_id, seq);
CREATE INDEX task_events_at ON task_events (at);

CREATE TABLE leaders (
    name       text PRIMARY KEY,
    owner      text NOT NULL,
    expires_at double precision NOT NULL
);
