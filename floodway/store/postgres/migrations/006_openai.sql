-- The OpenAI-compatible Batch API (docs/openai.md). Files: the JSONL a tenant uploads and the
-- output and error files floodway writes when a batch ends, kept in the ledger so that every
-- API process serves them and they survive restarts. A batch's tasks carry its id in
-- tasks.batch_id; its row keeps what OpenAI's batch object says beyond their counts.
CREATE TABLE openai_files (
    id          text PRIMARY KEY,
    tenant      text NOT NULL,
    purpose     text NOT NULL,
    filename    text NOT NULL,
    bytes       integer NOT NULL,
    content     bytea NOT NULL,
    created_at  double precision NOT NULL
);
CREATE INDEX openai_files_tenant ON openai_files (tenant, id);

CREATE TABLE openai_batches (
    id                 text PRIMARY KEY,
    tenant             text NOT NULL,
    endpoint           text NOT NULL,
    input_file_id      text NOT NULL,
    completion_window  text NOT NULL,
    status             text NOT NULL,
    total              integer NOT NULL,
    metadata           text,
    output_file_id     text,
    error_file_id      text,
    created_at         double precision NOT NULL,
    expires_at         double precision NOT NULL,
    cancelling_at      double precision,
    ended_at           double precision
);
CREATE INDEX openai_batches_tenant ON openai_batches (tenant, id);
-- Batches still running, for maintenance to end once their tasks have.
CREATE INDEX openai_batches_running ON openai_batches (id)
    WHERE status IN ('in_progress', 'cancelling');
