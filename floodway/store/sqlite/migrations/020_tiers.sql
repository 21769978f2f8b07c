-- Provider tiers (docs/spend.md): a task's tier (pinned at submit, or the one chosen when it
-- ran), and each billed call's tier with what it saved against the sync price.
ALTER TABLE tasks ADD COLUMN tier TEXT;
ALTER TABLE spend ADD COLUMN tier TEXT NOT NULL DEFAULT 'sync';
ALTER TABLE spend ADD COLUMN tier_saved REAL NOT NULL DEFAULT 0;
