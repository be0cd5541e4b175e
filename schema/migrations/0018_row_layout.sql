-- A row's columns stay in its heap tuple: one page read per row for every leg.
--
-- pgvector's `vector` type is stored EXTERNAL, so PostgreSQL moves it out of line (into the
-- partition's TOAST table) whenever a row passes 2 KB: every 1024-dimension row, and a 384-dimension
-- row with a sentence of text beside it. The dense leg's exact path then reads each row twice (heap,
-- then TOAST index and TOAST heap). Measured at 100k chunks, interleaved on three stores of the same
-- rows (benchmarks/results/2026-12-02/row-layout/): a researcher's 10% scope (10,000 rows) took 123 ms
-- with the vector out of line and 35 ms with this layout; the 1% scope 0.49x, HNSW 0.86x, the SQL
-- lexical leg 0.85x, the FAISS cache's load 0.83x. The vector inline alone (MAIN, default target)
-- pushes the text and tsvector out instead: the lexical legs 1.14-1.20x slower.
--
-- So: the embedding is stored MAIN (kept inline; moved out only when the row cannot fit a page), and
-- each partition's toast_tuple_target is 8160 (the largest allowed), so the text and the tsvector stay
-- inline too unless the row passes a page. A row that cannot fit a page is still TOASTed as before.
--
-- Rows written before this migration keep their layout until rewritten (re-embedded, or the whole
-- partition by `VACUUM FULL`, which takes an exclusive lock; or a backfill, which writes a new one).
ALTER TABLE rag_embeddings ALTER COLUMN embedding SET STORAGE MAIN;

DO $$
DECLARE
    v_partition text;
BEGIN
    FOR v_partition IN SELECT partition_name FROM rag_models LOOP
        EXECUTE format('ALTER TABLE %I SET (toast_tuple_target = 8160)', v_partition);
    END LOOP;
END;
$$;

-- New partitions take both (the storage from the parent table, the target set here).
CREATE OR REPLACE FUNCTION rag_provision_model(p_model text, p_dimension integer)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_dimension integer;
    v_partition text;
    v_type      text;
    v_requested text := coalesce(nullif(current_setting('mnemo.vector_type', true), ''), 'auto');
BEGIN
    IF p_model IS NULL OR length(p_model) = 0 THEN
        RAISE EXCEPTION 'rag_provision_model: model id must be non-empty';
    END IF;
    IF p_dimension IS NULL OR p_dimension < 1 OR p_dimension > 4000 THEN
        RAISE EXCEPTION 'rag_provision_model: dimension % is outside 1..4000 (pgvector HNSW limit)', p_dimension;
    END IF;
    IF v_requested NOT IN ('auto', 'vector', 'halfvec') THEN
        RAISE EXCEPTION 'mnemo.vector_type (RAG_VECTOR_TYPE) is %, not one of auto, vector, halfvec', v_requested;
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

    v_type := CASE
        WHEN v_requested <> 'auto' THEN v_requested
        WHEN p_dimension > 2000 THEN 'halfvec'
        ELSE 'vector'
    END;
    IF v_type = 'vector' AND p_dimension > 2000 THEN
        RAISE EXCEPTION 'model % has % dimensions: a vector HNSW index holds at most 2000; use halfvec or auto',
            p_model, p_dimension;
    END IF;
    -- Readable and collision-free: a slug of the id plus a hash of the exact id.
    v_partition := 'rag_emb_'
        || left(regexp_replace(lower(p_model), '[^a-z0-9]+', '_', 'g'), 32)
        || '_' || left(md5(p_model), 8);

    EXECUTE format('CREATE TABLE %I PARTITION OF rag_embeddings FOR VALUES IN (%L)', v_partition, p_model);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (vector_dims(embedding) = %s)',
                   v_partition, v_partition || '_dim_chk', p_dimension);
    EXECUTE format('ALTER TABLE %I SET (toast_tuple_target = 8160)', v_partition);
    EXECUTE format('CREATE INDEX %I ON %I USING hnsw ((embedding::%s(%s)) %s) WITH (m = 16, ef_construction = 64)',
                   v_partition || '_hnsw', v_partition, v_type, p_dimension, v_type || '_cosine_ops');

    INSERT INTO rag_models (model, dimension, vector_type, partition_name)
    VALUES (p_model, p_dimension, v_type, v_partition);
    RETURN v_partition;
END;
$$;
