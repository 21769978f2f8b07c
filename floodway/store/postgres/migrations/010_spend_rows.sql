-- Each spend row says what it is: a deduped task's saving is never a call, priced or not (a
-- free kind's call and a saving both have cost 0 and saved 0). over_estimate: what a call
-- billed above the hold its task was admitted at (a budget admits by the estimate, so this is
-- what went past it); the task's own is the sum over its calls.
ALTER TABLE spend ADD COLUMN deduped boolean NOT NULL DEFAULT false;
ALTER TABLE spend ADD COLUMN over_estimate double precision NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN over_estimate double precision NOT NULL DEFAULT 0;
UPDATE spend SET deduped = true
WHERE saved <> 0
   OR (cost = 0 AND input_tokens = 0 AND output_tokens = 0 AND images = 0
       AND task_id IN (SELECT id FROM tasks WHERE status = 'deduped'));
UPDATE spend SET over_estimate = greatest(0, spend.cost - t.spend_hold)
FROM tasks t WHERE t.id = spend.task_id AND NOT spend.deduped;
UPDATE tasks SET over_estimate = o.total
FROM (SELECT task_id, sum(over_estimate) AS total FROM spend
      WHERE over_estimate > 0 GROUP BY task_id) AS o
WHERE tasks.id = o.task_id;
