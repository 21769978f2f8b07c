-- The OpenAI-compatible Batch API's files and batches (floodway/store/openai_records.py).

-- name: insert_openai_file
INSERT INTO openai_files (id, tenant, purpose, filename, bytes, content, created_at)
VALUES (%(id)s, %(tenant)s, %(purpose)s, %(filename)s, %(bytes)s, %(content)s, %(created_at)s);

-- name: get_openai_file
SELECT id, tenant, purpose, filename, bytes, created_at FROM openai_files
WHERE id = %(id)s AND tenant = %(tenant)s;

-- name: list_openai_files
SELECT id, tenant, purpose, filename, bytes, created_at FROM openai_files
WHERE tenant = %(tenant)s AND (%(purpose)s::text IS NULL OR purpose = %(purpose)s::text)
  AND (%(after)s::text IS NULL OR id < %(after)s::text)
ORDER BY id DESC LIMIT %(limit)s;

-- name: openai_file_content
SELECT content FROM openai_files WHERE id = %(id)s AND tenant = %(tenant)s;

-- name: delete_openai_file
DELETE FROM openai_files WHERE id = %(id)s AND tenant = %(tenant)s;

-- name: insert_openai_batch
INSERT INTO openai_batches (id, tenant, endpoint, input_file_id, completion_window, status,
                            total, metadata, created_at, expires_at)
VALUES (%(id)s, %(tenant)s, %(endpoint)s, %(input_file_id)s, %(completion_window)s,
        %(status)s, %(total)s,
        %(metadata)s, %(created_at)s, %(expires_at)s);

-- name: get_openai_batch
SELECT * FROM openai_batches WHERE id = %(id)s AND tenant = %(tenant)s;

-- name: list_openai_batches
SELECT * FROM openai_batches
WHERE tenant = %(tenant)s AND (%(after)s::text IS NULL OR id < %(after)s::text)
ORDER BY id DESC LIMIT %(limit)s;

-- name: cancel_openai_batch
UPDATE openai_batches SET status = 'cancelling', cancelling_at = %(now)s
WHERE id = %(id)s AND tenant = %(tenant)s AND status = 'in_progress';

-- name: end_openai_batch
UPDATE openai_batches
SET status = %(status)s, output_file_id = %(output_file_id)s, error_file_id = %(error_file_id)s,
    ended_at = %(now)s
WHERE id = %(id)s AND status = %(expected)s;

-- name: ended_openai_batches
SELECT * FROM openai_batches b
WHERE status IN ('in_progress', 'cancelling')
  AND NOT EXISTS (
    SELECT 1 FROM tasks t
    WHERE t.batch_id = b.id
      AND (t.status NOT IN ('succeeded', 'deduped', 'failed', 'dead', 'timeout', 'cancelled')
           OR t.lease_token IS NOT NULL))  -- a call still read to its end (core/hangup.py)
ORDER BY id LIMIT %(limit)s;
