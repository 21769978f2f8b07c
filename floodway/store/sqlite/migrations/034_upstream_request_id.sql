-- The provider's request id of the task's last call that answered (OpenAI's x-request-id,
-- Anthropic's request-id): what its support asks for. A deduped task takes the id of the call
-- whose result it took.
ALTER TABLE tasks ADD COLUMN upstream_request_id TEXT;
