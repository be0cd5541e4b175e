-- The embeddings store: one logical table partitioned by model.
--
-- PostgreSQL will not let a partition retype an inherited column, so the
-- `embedding` column is an untyped `vector` and each model's partition gets an
-- HNSW expression index on `(embedding::vector(N))` (or `::halfvec(N)` above
-- 2000 dimensions, pgvector's HNSW limit for `vector`). Queries must use the
-- same cast to reach the index; `rag_models` records which cast that is.

CREATE TABLE IF NOT EXISTS rag_models (
    model          text PRIMARY KEY,
    dimension      integer NOT NULL CHECK (dimension BETWEEN 1 AND 4000),
    vector_type    text NOT NULL CHECK (vector_type IN ('vector', 'halfvec')),
    partition_name text NOT NULL UNIQUE,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS rag_embeddings (
    model          text NOT NULL,
    modality       text NOT NULL CHECK (modality IN ('text', 'image')),
    section_tipo   text NOT NULL,
    section_id     bigint NOT NULL,
    component_tipo text NOT NULL,            -- 'rag:<group>' for group documents
    lang           text NOT NULL DEFAULT 'lg-nolan',
    chunk_index    integer NOT NULL DEFAULT 0,
    view           text NOT NULL DEFAULT '', -- image view (obverse, reverse); '' for text
    parent_key     text,
    source_hash    text NOT NULL,
    source_text    text NOT NULL DEFAULT '', -- the raw passage, for citation
    lexical_text   text NOT NULL DEFAULT '', -- accent-folded in Python (no unaccent here)
    lexical        tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, lexical_text)) STORED,
    embedding      vector NOT NULL,
    sparse         sparsevec,                -- learned-sparse weights, when the model gives them
    token_count    integer,
    projects       integer[] NOT NULL DEFAULT '{}',
    chunk_meta     jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, section_tipo, section_id, component_tipo, lang, view, chunk_index)
) PARTITION BY LIST (model);

-- Partitioned indexes: every partition inherits them.
CREATE INDEX IF NOT EXISTS rag_embeddings_lexical_idx ON rag_embeddings USING gin (lexical);
CREATE INDEX IF NOT EXISTS rag_embeddings_record_idx ON rag_embeddings (section_tipo, section_id);
CREATE INDEX IF NOT EXISTS rag_embeddings_projects_idx ON rag_embeddings USING gin (projects);

-- Creates (once) the partition for a model and its HNSW cosine index typed to
-- the model's dimension. Idempotent and safe under concurrency (transaction
-- advisory lock). A model seen again with another dimension is an error: a
-- model switch is a new model id, never a silent rewrite.
CREATE OR REPLACE FUNCTION rag_provision_model(p_model text, p_dimension integer)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_dimension integer;
    v_partition text;
    v_type      text;
BEGIN
    IF p_model IS NULL OR length(p_model) = 0 THEN
        RAISE EXCEPTION 'rag_provision_model: model id must be non-empty';
    END IF;
    IF p_dimension IS NULL OR p_dimension < 1 OR p_dimension > 4000 THEN
        RAISE EXCEPTION 'rag_provision_model: dimension % is outside 1..4000 (pgvector HNSW limit)', p_dimension;
    END IF;

    PERFORM pg_advisory_xact_lock(hashtext('mnemo.rag_provision_model'));

    SELECT dimension, partition_name INTO v_dimension, v_partition
      FROM rag_models WHERE model = p_model;
    IF FOUND THEN
        IF v_dimension <> p_dimension THEN
            RAISE EXCEPTION 'model % is provisioned with dimension %, not %; serve it under a new model id',
                p_model, v_dimension, p_dimension;
        END IF;
        RETURN v_partition;
    END IF;

    v_type := CASE WHEN p_dimension > 2000 THEN 'halfvec' ELSE 'vector' END;
    -- Readable and collision-free: a slug of the id plus a hash of the exact id.
    v_partition := 'rag_emb_'
        || left(regexp_replace(lower(p_model), '[^a-z0-9]+', '_', 'g'), 32)
        || '_' || left(md5(p_model), 8);

    EXECUTE format('CREATE TABLE %I PARTITION OF rag_embeddings FOR VALUES IN (%L)', v_partition, p_model);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (vector_dims(embedding) = %s)',
                   v_partition, v_partition || '_dim_chk', p_dimension);
    EXECUTE format('CREATE INDEX %I ON %I USING hnsw ((embedding::%s(%s)) %s) WITH (m = 16, ef_construction = 64)',
                   v_partition || '_hnsw', v_partition, v_type, p_dimension, v_type || '_cosine_ops');

    INSERT INTO rag_models (model, dimension, vector_type, partition_name)
    VALUES (p_model, p_dimension, v_type, v_partition);
    RETURN v_partition;
END;
$$;
