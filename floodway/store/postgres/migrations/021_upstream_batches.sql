-- Provider batches (docs/spend.md): each batch-tier task's request is a line, queued until its
-- kind and model's next batch is packed; a batch's row is written (its lines assigned) before
-- the provider is asked to create it, so a crash in between is reconciled by its id in the
-- provider batch's metadata, never by a second batch.
CREATE TABLE upstream_batches (
    id          text PRIMARY KEY,
    kind        text NOT NULL,
    model       text NOT NULL,
    state       text NOT NULL,
    provider_id text,
    lines       integer NOT NULL DEFAULT 0,
    created_at  double precision NOT NULL,
    sent_at     double precision,
    ended_at    double precision
);
CREATE INDEX upstream_batches_open ON upstream_batches (state, created_at);
CREATE TABLE upstream_lines (
    task_id       text PRIMARY KEY,
    kind          text NOT NULL,
    model         text NOT NULL,
    body          text NOT NULL,
    state         text NOT NULL,
    batch_id      text,
    added_at      double precision NOT NULL,
    deadline_at   double precision,
    result        text,
    input_tokens  double precision NOT NULL DEFAULT 0,
    output_tokens double precision NOT NULL DEFAULT 0,
    error         text,
    error_type    text,
    fatal         boolean NOT NULL DEFAULT false,
    updated_at    double precision NOT NULL
);
CREATE INDEX upstream_lines_pool ON upstream_lines (kind, model, state, added_at);
CREATE INDEX upstream_lines_batch ON upstream_lines (batch_id);
