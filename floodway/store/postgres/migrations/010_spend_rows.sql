-- Each spend row says what it is: a deduped task's saving is never a call, priced or not (a
-- free kind's call and a saving both have cost 0 and saved 0). over_estimate: what a call
-- billed above the hold its task was admitted at (a budget admits by the estimate, so this is
-- what went past it).
ALTER TABLE spend ADD COLUMN deduped boolean NOT NULL DEFAULT false;
ALTER TABLE spend ADD COLUMN over_estimate double precision NOT NULL DEFAULT 0;
UPDATE spend SET deduped = true
WHERE saved <> 0
   OR (cost = 0 AND input_tokens = 0 AND output_tokens = 0 AND images = 0
       AND task_id IN (SELECT id FROM tasks WHERE status = 'deduped'));
