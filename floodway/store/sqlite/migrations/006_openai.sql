-- The OpenAI-compatible Batch API (docs/openai.md). Files: the JSONL a tenant uploads and the
-- output and error files floodway writes when a batch ends, kept in the ledger so that every
-- API process serves them and they survive restarts. A batch's tasks carry its id in
-- tasks.batch_id; its row keeps what OpenAI's batch object says beyond their counts.
CREATE TABLE openai_files (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    purpose     TEXT NOT NULL,
    filename    TEXT NOT NULL,
    bytes       INTEGER NOT NULL,
    content     BLOB NOT NULL,
    created_at  REAL NOT NULL
);
CREATE INDEX openai_files_tenant ON openai_files (tenant, id);

CREATE TABLE openai_batches (
    id                 TEXT PRIMARY KEY,
    tenant             TEXT NOT NULL,
    endpoint           TEXT NOT NULL,
    input_file_id      TEXT NOT NULL,
    completion_window  TEXT NOT NULL,
    status             TEXT NOT NULL,
    total              INTEGER NOT NULL,
    metadata           TEXT,
    output_file_id     TEXT,
    error_file_id      TEXT,
    created_at         REAL NOT NULL,
    expires_at         REAL NOT NULL,
    cancelling_at      REAL,
    ended_at           REAL
);
CREATE INDEX openai_batches_tenant ON openai_batches (tenant, id);
-- Batches still running, for maintenance to end once their tasks have.
CREATE INDEX openai_batches_running ON openai_batches (id)
    WHERE status IN ('in_progress', 'cancelling');
