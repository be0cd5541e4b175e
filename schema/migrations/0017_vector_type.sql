-- RAG_VECTOR_TYPE: the element type of a new partition's HNSW index.
--
-- The gateway and the CLI put the setting on their write pool's sessions as the custom parameter
-- `mnemo.vector_type` (schema.database.create_pool); an operator can also set it for the database
-- (`ALTER DATABASE mnemo SET mnemo.vector_type = 'halfvec'`). Values:
--   auto    (default) `vector` up to 2000 dimensions, `halfvec` above (pgvector's HNSW limits);
--   vector  4-byte floats; refused above 2000 dimensions;
--   halfvec 2-byte floats: an index about half the size (a 1024-dimension model's graph fits in half
--           the memory) for a small recall cost (benchmarks/scale_store.py measures both).
-- The stored column stays `vector` (the partitioned table's column cannot be retyped per partition):
-- the choice is the index's, and the cast every dense query uses (rag_models.vector_type).
-- It applies when a model's partition is created; an existing partition keeps its type.
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
    EXECUTE format('CREATE INDEX %I ON %I USING hnsw ((embedding::%s(%s)) %s) WITH (m = 16, ef_construction = 64)',
                   v_partition || '_hnsw', v_partition, v_type, p_dimension, v_type || '_cosine_ops');

    INSERT INTO rag_models (model, dimension, vector_type, partition_name)
    VALUES (p_model, p_dimension, v_type, v_partition);
    RETURN v_partition;
END;
$$;
