-- The embeddings store's change feed (the FAISS cache in the gateway follows it).
--
-- Every write to rag_embeddings (insert, update, delete; COPY too) stamps the row's key in
-- rag_embedding_changes with a fresh number from a monotonic sequence and the writing
-- transaction's id, and notifies channel `rag_embeddings_changed` (payload: the model) on
-- commit. The table is compacted: one row per key ever written, holding its latest change, so
-- it grows with the number of keys, not with the number of writes; a deleted row leaves its
-- key behind as a tombstone (the row is gone from rag_embeddings).
--
-- Sequence numbers are taken before commit, so they can become visible out of order: a reader
-- that has seen every change up to seq S, reading at a snapshot whose oldest running
-- transaction is X, must next read `seq > S OR xid >= X` (a transaction that was still running
-- may commit a smaller seq later). The xid column makes that re-read an index scan.
-- TRUNCATE is not fed; Mnemo never truncates the store.

CREATE SEQUENCE IF NOT EXISTS rag_change_seq;

CREATE TABLE IF NOT EXISTS rag_embedding_changes (
    model          text NOT NULL,
    modality       text NOT NULL,
    section_tipo   text NOT NULL,
    section_id     bigint NOT NULL,
    component_tipo text NOT NULL,
    lang           text NOT NULL,
    view           text NOT NULL,
    chunk_index    integer NOT NULL,
    seq            bigint NOT NULL,
    xid            xid8 NOT NULL,
    changed_at     timestamptz NOT NULL,
    PRIMARY KEY (model, section_tipo, section_id, component_tipo, lang, view, chunk_index)
);
CREATE INDEX IF NOT EXISTS rag_embedding_changes_seq_idx ON rag_embedding_changes (model, seq);
CREATE INDEX IF NOT EXISTS rag_embedding_changes_xid_idx ON rag_embedding_changes (model, xid);

CREATE OR REPLACE FUNCTION rag_embeddings_changed() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := OLD;
    ELSE
        r := NEW;
    END IF;
    -- An update that moves a row to another key (Mnemo's writers never do) retires the old key too.
    IF TG_OP = 'UPDATE' AND (OLD.model, OLD.section_tipo, OLD.section_id, OLD.component_tipo, OLD.lang,
                             OLD.view, OLD.chunk_index)
                         IS DISTINCT FROM (NEW.model, NEW.section_tipo, NEW.section_id, NEW.component_tipo,
                                           NEW.lang, NEW.view, NEW.chunk_index) THEN
        INSERT INTO rag_embedding_changes AS c
        VALUES (OLD.model, OLD.modality, OLD.section_tipo, OLD.section_id, OLD.component_tipo, OLD.lang,
                OLD.view, OLD.chunk_index, nextval('rag_change_seq'), pg_current_xact_id(), clock_timestamp())
        ON CONFLICT (model, section_tipo, section_id, component_tipo, lang, view, chunk_index)
        DO UPDATE SET modality = EXCLUDED.modality, seq = EXCLUDED.seq, xid = EXCLUDED.xid,
                      changed_at = EXCLUDED.changed_at;
    END IF;
    INSERT INTO rag_embedding_changes AS c
    VALUES (r.model, r.modality, r.section_tipo, r.section_id, r.component_tipo, r.lang,
            r.view, r.chunk_index, nextval('rag_change_seq'), pg_current_xact_id(), clock_timestamp())
    ON CONFLICT (model, section_tipo, section_id, component_tipo, lang, view, chunk_index)
    DO UPDATE SET modality = EXCLUDED.modality, seq = EXCLUDED.seq, xid = EXCLUDED.xid,
                  changed_at = EXCLUDED.changed_at;
    -- Identical notifications of one transaction are folded into one, delivered at commit.
    PERFORM pg_notify('rag_embeddings_changed', r.model);
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS rag_embeddings_change_feed ON rag_embeddings;
CREATE TRIGGER rag_embeddings_change_feed
    AFTER INSERT OR UPDATE OR DELETE ON rag_embeddings
    FOR EACH ROW EXECUTE FUNCTION rag_embeddings_changed();
