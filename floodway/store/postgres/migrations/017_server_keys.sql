-- Keys every process of a deployment must share (the page cursors' encryption key:
-- floodway/wire/cursors.py): the first process to need one writes it, all read that one.
CREATE TABLE server_keys (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
