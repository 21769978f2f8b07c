-- Provider tiers (docs/spend.md): a task's tier (pinned at submit, or the one chosen when it
-- ran), and each billed call's tier with what it saved against the sync price.
ALTER TABLE tasks ADD COLUMN tier text;
ALTER TABLE spend ADD COLUMN tier text NOT NULL DEFAULT 'sync';
ALTER TABLE spend ADD COLUMN tier_saved double precision NOT NULL DEFAULT 0;
