-- Extensions Mnemo depends on. The runner checks pg_available_extensions first
-- and fails with a clear message when the server lacks pgvector, so this only
-- ever creates what the server can provide.
CREATE EXTENSION IF NOT EXISTS vector;
