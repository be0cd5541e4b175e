-- Parallel drain workers (issue 23). A worker claims queue rows with
-- `FOR UPDATE SKIP LOCKED` and stamps them with a lease: who holds the row and
-- until when (the database's clock, so hosts need not agree on time). A live
-- worker renews its leases; a killed one stops, and once `lease_until` passes
-- another worker may claim the row. A newer push keeps the lease, so the
-- record is never processed by two workers at once.
ALTER TABLE rag_index_queue
    ADD COLUMN IF NOT EXISTS lease_owner text,
    ADD COLUMN IF NOT EXISTS lease_until timestamptz;

CREATE INDEX IF NOT EXISTS rag_index_queue_lease_owner_idx
    ON rag_index_queue (lease_owner) WHERE lease_owner IS NOT NULL;

-- Who drains: one row per running worker (a `mnemo drain` worker, or the
-- gateway's), refreshed with its heartbeat, for `mnemo queue stats` and
-- `/metrics`. A worker removes its row when it stops; a killed one's row goes
-- stale (its heartbeat stops) and is pruned a day later.
CREATE TABLE IF NOT EXISTS rag_drain_workers (
    worker_id       text PRIMARY KEY,
    role            text NOT NULL,
    host            text NOT NULL,
    pid             integer NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    records_done    bigint NOT NULL DEFAULT 0,
    records_failed  bigint NOT NULL DEFAULT 0,
    chunks_embedded bigint NOT NULL DEFAULT 0,
    records_per_s   double precision NOT NULL DEFAULT 0
);
