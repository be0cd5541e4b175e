-- Bulk backfills (issue 23): a durable progress record, and which model serves each kind.
--
-- A backfill (`mnemo backfill`, index/backfill.py) rebuilds one model's partition in a shadow
-- table: it COPYs rows there without indexes, builds the indexes, then swaps the shadow in for
-- the partition in one transaction. rag_backfills is the run (its target, source, shadow, state
-- and the change-feed watermarks it catches up from); rag_backfill_records its scope, one row
-- per record with the record's state. A record's rows are COPYed into the shadow in the same
-- transaction that marks it `copied`, so a run killed at any point resumes where it stopped and
-- never writes a record twice.
CREATE TABLE IF NOT EXISTS rag_backfills (
    backfill_id   text PRIMARY KEY,
    target_model  text NOT NULL REFERENCES rag_models (model),
    source        text NOT NULL CHECK (source IN ('queue', 'jsonl', 'model')),
    source_detail jsonb NOT NULL,
    shadow_table  text NOT NULL,
    state         text NOT NULL CHECK (state IN ('embedding', 'building', 'swapped', 'abandoned')),
    -- The target partition's change feed when its out-of-scope rows were copied (read before the
    -- copy, in the copy's transaction): rows written to the live partition after it are copied
    -- again at the swap. NULL until that copy has committed: a rerun then copies them.
    target_seq    bigint,
    target_xmin   bigint,
    -- A model change: the source partition's change feed when the scope was last read.
    source_seq    bigint,
    source_xmin   bigint,
    started_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    report        jsonb NOT NULL DEFAULT '{}'::jsonb
);
-- One unfinished backfill per target model: a rerun resumes it.
CREATE UNIQUE INDEX IF NOT EXISTS rag_backfills_running_idx
    ON rag_backfills (target_model) WHERE state IN ('embedding', 'building');

CREATE TABLE IF NOT EXISTS rag_backfill_records (
    backfill_id  text NOT NULL REFERENCES rag_backfills (backfill_id) ON DELETE CASCADE,
    section_tipo text NOT NULL,
    section_id   bigint NOT NULL,
    state        text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'copied', 'rejected')),
    version      bigint,            -- the queue version that was embedded (source 'queue')
    rows_written integer NOT NULL DEFAULT 0,
    reason       text,              -- why a record was rejected
    PRIMARY KEY (backfill_id, section_tipo, section_id)
);
CREATE INDEX IF NOT EXISTS rag_backfill_records_state_idx ON rag_backfill_records (backfill_id, state);

-- The model that serves each kind of query ('text'), set by a model-change backfill in the same
-- transaction that attaches the new model's complete partition: retrieval embeds the query with
-- the model named here and searches that model's partition, so it moves from the old vectors to
-- the new ones at one commit. No row: the configured or the sidecar's first model (as before).
CREATE TABLE IF NOT EXISTS rag_serving_models (
    kind       text PRIMARY KEY,
    model      text NOT NULL REFERENCES rag_models (model),
    changed_at timestamptz NOT NULL DEFAULT now()
);
