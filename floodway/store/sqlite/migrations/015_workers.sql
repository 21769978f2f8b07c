-- The workers of every process on this ledger, as each last said (GET /v1/workers): a worker
-- writes its row when it starts and every few seconds after, and deletes it when it stops;
-- the row of a worker that died stays until its heartbeat is a day old. Its current tasks
-- are the rows whose lease it holds (tasks.lease_owner = workers.owner).
CREATE TABLE workers (
    owner        TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    concurrency  INTEGER NOT NULL,
    kinds        TEXT NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);
CREATE INDEX workers_heartbeat ON workers (heartbeat_at);
