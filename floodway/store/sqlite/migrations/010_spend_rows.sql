-- Each spend row says what it is: a deduped task's saving is never a call, priced or not (a
-- free kind's call and a saving both have cost 0 and saved 0). over_estimate: what a call
-- billed above the hold its task was admitted at (a budget admits by the estimate, so this is
-- what went past it); the task's own is the sum over its calls.
ALTER TABLE spend ADD COLUMN deduped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE spend ADD COLUMN over_estimate REAL NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN over_estimate REAL NOT NULL DEFAULT 0;
UPDATE spend SET deduped = 1
WHERE saved <> 0
   OR (cost = 0 AND input_tokens = 0 AND output_tokens = 0 AND images = 0
       AND task_id IN (SELECT id FROM tasks WHERE status = 'deduped'));
UPDATE spend SET over_estimate = max(0, cost - (SELECT t.spend_hold FROM tasks t
                                                WHERE t.id = spend.task_id))
WHERE deduped = 0 AND task_id IN (SELECT id FROM tasks);
UPDATE tasks SET over_estimate = (SELECT sum(s.over_estimate) FROM spend s
                                  WHERE s.task_id = tasks.id)
WHERE id IN (SELECT task_id FROM spend WHERE over_estimate > 0);
