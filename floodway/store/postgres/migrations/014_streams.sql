-- A streamed call's events as they arrive (an OpenAI-compatible stream: docs/openai.md): the
-- worker that reads the provider appends them, every API process answering a client of the
-- same work reads them from here. The whole stream is the task's result once it ended; these
-- rows expire with results ([retention] results).
CREATE TABLE stream_events (
    task_id TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    data    TEXT NOT NULL,
    at      DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (task_id, seq)
);
CREATE INDEX stream_events_at ON stream_events (at);
