-- The ACL push-down's inputs as arrays (issue 15): what a chunk needs readable, stored per row.
--
-- The gateway's gate reads a chunk when every component it needs is readable: its own component,
-- or for a group chunk (`rag:<group>`) every contributor in chunk_meta.contributors ("<component>"
-- of the chunk's section, or "<section>/<component>"; a missing, empty or malformed list fails
-- closed). The SQL push-down used to check that per row in jsonb: a subquery over
-- jsonb_array_elements with string splitting and two jsonb look-ups per contributor, which the
-- planner could not estimate (a default selectivity) and which cost about 3 µs per row wherever a
-- plan visits many rows (a bitmap scan of a 10% scope, the FAISS cache's scope bitmaps).
--
-- acl_pairs holds the "<section>/<component>" pairs a chunk needs, acl_sections their sections
-- (same order); both NULL when the contributors are malformed (fails closed for everyone but
-- admins, who get no push-down). The push-down is then array operators the planner has element
-- statistics for (see index/search.py, _Sql._apply_acl). Adding the stored columns rewrites the
-- table once, so existing rows get them without re-indexing.

-- Whether a chunk's ACL inputs are well formed: any non-group chunk; a group chunk whose
-- contributors are a non-empty array of strings, each "<component>" or "<section>/<component>".
CREATE OR REPLACE FUNCTION rag_acl_well_formed(p_component text, p_meta jsonb)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_component NOT LIKE 'rag:%' OR (
        jsonb_typeof(p_meta -> 'contributors') IS NOT DISTINCT FROM 'array'
        AND jsonb_array_length(p_meta -> 'contributors') > 0
        AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_meta -> 'contributors') AS c(v)
                        WHERE jsonb_typeof(c.v) <> 'string' OR (c.v #>> '{}') ~ '(^$|^/|/$|/.*/)'))
$$;

-- "<section>/<component>" per needed component (the gateway's perms keys), in contributor order.
CREATE OR REPLACE FUNCTION rag_acl_pairs(p_section text, p_component text, p_meta jsonb)
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN NOT rag_acl_well_formed(p_component, p_meta) THEN NULL
        WHEN p_component NOT LIKE 'rag:%' THEN ARRAY[p_section || '/' || p_component]
        ELSE (SELECT array_agg(CASE WHEN strpos(c.v, '/') > 0 THEN c.v ELSE p_section || '/' || c.v END
                               ORDER BY c.n)
              FROM jsonb_array_elements_text(p_meta -> 'contributors') WITH ORDINALITY AS c(v, n))
    END
$$;

-- The section of each pair, same order.
CREATE OR REPLACE FUNCTION rag_acl_sections(p_section text, p_component text, p_meta jsonb)
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN NOT rag_acl_well_formed(p_component, p_meta) THEN NULL
        WHEN p_component NOT LIKE 'rag:%' THEN ARRAY[p_section]
        ELSE (SELECT array_agg(CASE WHEN strpos(c.v, '/') > 0 THEN split_part(c.v, '/', 1) ELSE p_section END
                               ORDER BY c.n)
              FROM jsonb_array_elements_text(p_meta -> 'contributors') WITH ORDINALITY AS c(v, n))
    END
$$;

ALTER TABLE rag_embeddings
    ADD COLUMN IF NOT EXISTS acl_pairs text[]
        GENERATED ALWAYS AS (rag_acl_pairs(section_tipo, component_tipo, chunk_meta)) STORED,
    ADD COLUMN IF NOT EXISTS acl_sections text[]
        GENERATED ALWAYS AS (rag_acl_sections(section_tipo, component_tipo, chunk_meta)) STORED;
