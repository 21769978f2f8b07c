-- The outbox of a completion's effects (a poison task's fallback, a dead task's alert),
-- written in the completion's own transaction and delivered from here by the outbox
-- (floodway/maintenance/outbox.py): a crash between the two loses none, and no worker waits
-- on an alert endpoint. A row is deleted once delivered (or given up).
CREATE TABLE effects (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id  TEXT NOT NULL,
    effect   TEXT NOT NULL CHECK (effect IN ('fallback', 'alert')),
    attempts INTEGER NOT NULL DEFAULT 0,
    due_at   REAL NOT NULL
);
CREATE INDEX effects_due ON effects (due_at);
