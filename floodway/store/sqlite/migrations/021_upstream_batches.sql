-- Provider batches (docs/spend.md): each batch-tier task's request is a line, queued until its
-- kind and model's next batch is packed; a batch's row is written (its lines assigned) before
-- the provider is asked to create it, so a crash in between is reconciled by its id in the
-- provider batch's metadata, never by a second batch.
CREATE TABLE upstream_batches (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    model       TEXT NOT NULL,
    state       TEXT NOT NULL,
    provider_id TEXT,
    lines       INTEGER NOT NULL DEFAULT 0,
    created_at  REAL NOT NULL,
    sent_at     REAL,
    ended_at    REAL
);
CREATE INDEX upstream_batches_open ON upstream_batches (state, created_at);
CREATE TABLE upstream_lines (
    task_id       TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    model         TEXT NOT NULL,
    body          TEXT NOT NULL,
    state         TEXT NOT NULL,
    batch_id      TEXT,
    added_at      REAL NOT NULL,
    deadline_at   REAL,
    result        TEXT,
    input_tokens  REAL NOT NULL DEFAULT 0,
    output_tokens REAL NOT NULL DEFAULT 0,
    error         TEXT,
    error_type    TEXT,
    fatal         INTEGER NOT NULL DEFAULT 0,
    updated_at    REAL NOT NULL
);
CREATE INDEX upstream_lines_pool ON upstream_lines (kind, model, state, added_at);
CREATE INDEX upstream_lines_batch ON upstream_lines (batch_id);
