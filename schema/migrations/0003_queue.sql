-- The durable ingestion queue: one row per record awaiting work. A newer push
-- for the same record replaces the pending payload and bumps `version`; the
-- drain deletes a row only when the version it processed is still current, so
-- an edit that lands mid-drain is never lost.
CREATE TABLE IF NOT EXISTS rag_index_queue (
    section_tipo    text NOT NULL,
    section_id      bigint NOT NULL,
    operation       text NOT NULL CHECK (operation IN ('index', 'delete')),
    payload         jsonb,
    version         bigint NOT NULL DEFAULT 1,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (section_tipo, section_id)
);

CREATE INDEX IF NOT EXISTS rag_index_queue_ready_idx ON rag_index_queue (next_attempt_at, attempts);
