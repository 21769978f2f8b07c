-- The OpenAI-compatible Batch API's files and batches (floodway/store/openai_records.py).

-- name: insert_openai_file
INSERT INTO openai_files (id, tenant, purpose, filename, bytes, content, created_at)
VALUES (:id, :tenant, :purpose, :filename, :bytes, :content, :created_at);

-- name: get_openai_file
SELECT id, tenant, purpose, filename, bytes, created_at FROM openai_files
WHERE id = :id AND tenant = :tenant;

-- name: list_openai_files
SELECT id, tenant, purpose, filename, bytes, created_at FROM openai_files
WHERE tenant = :tenant AND (:purpose IS NULL OR purpose = :purpose)
  AND (:after IS NULL OR id < :after)
ORDER BY id DESC LIMIT :limit;

-- name: openai_file_content
SELECT content FROM openai_files WHERE id = :id AND tenant = :tenant;

-- name: delete_openai_file
DELETE FROM openai_files WHERE id = :id AND tenant = :tenant;

-- name: insert_openai_batch
INSERT INTO openai_batches (id, tenant, endpoint, input_file_id, completion_window, status,
                            total, metadata, created_at, expires_at)
VALUES (:id, :tenant, :endpoint, :input_file_id, :completion_window, :status, :total,
        :metadata, :created_at, :expires_at);

-- name: get_openai_batch
SELECT * FROM openai_batches WHERE id = :id AND tenant = :tenant;

-- name: list_openai_batches
SELECT * FROM openai_batches
WHERE tenant = :tenant AND (:after IS NULL OR id < :after)
ORDER BY id DESC LIMIT :limit;

-- name: cancel_openai_batch
UPDATE openai_batches SET status = 'cancelling', cancelling_at = :now
WHERE id = :id AND tenant = :tenant AND status = 'in_progress';

-- name: end_openai_batch
UPDATE openai_batches
SET status = :status, output_file_id = :output_file_id, error_file_id = :error_file_id,
    ended_at = :now
WHERE id = :id AND status = :expected;

-- name: ended_openai_batches
SELECT * FROM openai_batches b
WHERE status IN ('in_progress', 'cancelling')
  AND NOT EXISTS (
    SELECT 1 FROM tasks t
    WHERE t.batch_id = b.id
      AND (t.status NOT IN ('succeeded', 'deduped', 'failed', 'dead', 'timeout', 'cancelled')
           OR t.lease_token IS NOT NULL))  -- a call still read to its end (core/hangup.py)
ORDER BY id LIMIT :limit;
