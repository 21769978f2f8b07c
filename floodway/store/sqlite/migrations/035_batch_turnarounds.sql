-- What floodway measured of each provider batch that completed: its turnaround, from its row
-- to its end (docs/spend.md). A process reads each kind's recent ones at start-up, so a
-- restart judges the batch tier from what was learned, not from the configured estimate.
ALTER TABLE upstream_batches ADD COLUMN turnaround REAL;
CREATE INDEX upstream_batches_learned ON upstream_batches (kind, ended_at)
    WHERE turnaround IS NOT NULL;
