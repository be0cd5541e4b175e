-- Section descriptors: a section's embed groups (with chunk settings), image
-- context, system prompt and egress flags, shaped like the archive's `rag`
-- object and keyed by section tipo.
CREATE TABLE IF NOT EXISTS rag_sections (
    section_tipo text PRIMARY KEY,
    descriptor   jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
