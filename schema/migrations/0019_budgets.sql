-- Budgets per principal (issue 45). The ledger: what each principal (the token's
-- subject) used of each meter in each window. A window is identified by its start
-- (UTC; a day by default, RAG_BUDGET_WINDOW sets its length), so a new window
-- starts a new row and old rows stay as the history `mnemo budgets show` reads.
-- The gateway reserves with one statement (INSERT ... ON CONFLICT DO UPDATE
-- ... WHERE used + n <= limit), so concurrent callers can never overspend, and
-- refunds what a failed or shorter call did not use.
CREATE TABLE IF NOT EXISTS rag_budget_ledger (
    principal    text NOT NULL,
    meter        text NOT NULL,
    window_start timestamptz NOT NULL,
    used         bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    role         text NOT NULL,  -- the role the principal's token carried last (whose default applied)
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (principal, meter, window_start)
);

-- Per-principal limits that replace the role's default for one meter.
-- max_units NULL: unlimited for this principal (still counted).
CREATE TABLE IF NOT EXISTS rag_budget_overrides (
    principal  text NOT NULL,
    meter      text NOT NULL,
    max_units  bigint CHECK (max_units IS NULL OR max_units >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (principal, meter)
);
