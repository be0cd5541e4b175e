"""The budgets' settings (issue 45): what is metered, the roles whose defaults ``RAG_BUDGET_LIMITS``
sets, the window, the ``ask`` grant and the per-principal limiter. Read by :mod:`gateway.budgets.ledger`,
:mod:`gateway.budgets.fairness` and ``mnemo budgets``; one of the settings catalog's modules."""

from __future__ import annotations

from dataclasses import dataclass

from schema.settings import SettingsError, setting

__all__ = ["ASK_GRANT_MODES", "METERS", "ROLES", "BudgetSettings", "parse_limits"]

# Budgets (issue 45): what is metered, and the roles whose defaults RAG_BUDGET_LIMITS sets.
METERS = ("ask", "llm_prompt_tokens", "llm_completion_tokens", "query_embeddings", "embedding_input_tokens")
ROLES = ("user", "admin")
ASK_GRANT_MODES = ("required", "open")


def parse_limits(raw: str) -> dict[tuple[str, str], int]:
    """``"user.ask=200,admin.ask=1000"`` -> ``{("user", "ask"): 200, ("admin", "ask"): 1000}``.

    A (role, meter) not named is unlimited (still counted in the ledger)."""
    limits: dict[tuple[str, str], int] = {}
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        role, dot, meter = key.strip().partition(".")
        if not sep or not dot or role not in ROLES or meter not in METERS:
            raise SettingsError(
                f"RAG_BUDGET_LIMITS entry {part!r}: use role.meter=N with role in {ROLES} and meter in {METERS}"
            )
        try:
            units = int(value)
        except ValueError as exc:
            raise SettingsError(f"RAG_BUDGET_LIMITS entry {part!r}: {value!r} is not an integer") from exc
        if units < 0:
            raise SettingsError(f"RAG_BUDGET_LIMITS entry {part!r}: a limit is >= 0")
        limits[(role, meter)] = units
    return limits


@dataclass(frozen=True)
class BudgetSettings:
    """Per-principal budgets (a ledger in PostgreSQL) and the per-principal fairness limiter."""

    enabled: bool = setting(
        "RAG_BUDGETS",
        True,
        "Meter every principal's `ask` runs, language-model tokens, query embeddings and `POST "
        "/v1/embeddings` input tokens in the ledger and refuse (429 `budget_exhausted`) past the limit. "
        "Off: nothing is counted or refused.",
    )
    window: int = setting(
        "RAG_BUDGET_WINDOW",
        86400,
        "Seconds in one budget window, aligned to the UTC epoch (86400: a UTC day, reset at midnight UTC).",
    )
    lease: int = setting(
        "RAG_BUDGET_LEASE",
        16,
        "Units of a meter a gateway worker reserves at once for a principal the ledger gives no limit "
        "on that meter (an admin by default), then hands to its calls one by one: one ledger write "
        "per lease instead of one per search. Unused units go back after `RAG_BUDGET_LEASE_IDLE`, at "
        "the window's end and when the gateway stops; a worker killed holding a lease leaves fewer "
        "than this many units counted but unused. A principal with a limit is reserved call by call. "
        "1: every call reserves in the ledger.",
    )
    lease_idle: float = setting(
        "RAG_BUDGET_LEASE_IDLE",
        2.0,
        "Seconds a lease (`RAG_BUDGET_LEASE`) may sit unused before its unused units go back to the ledger.",
    )
    limits: str = setting(
        "RAG_BUDGET_LIMITS",
        "user.ask=200,user.llm_prompt_tokens=1000000,user.llm_completion_tokens=200000,"
        "user.query_embeddings=10000,user.embedding_input_tokens=1000000",
        "Per-role limits per window, `role.meter=N` comma-separated (roles: user, admin; meters: ask, "
        "llm_prompt_tokens, llm_completion_tokens, query_embeddings, embedding_input_tokens). Unnamed: "
        "unlimited but counted. "
        "`mnemo budgets set` overrides one principal.",
    )
    ask_grant: str = setting(
        "RAG_ASK_GRANT",
        "required",
        '`required`: `ask` needs the token claim `grants` to hold "ask" (admins always may), else 403 '
        "`auth.ask_not_granted` before any retrieval. `open`: every authenticated caller may ask.",
    )
    fair_rate: float = setting(
        "RAG_FAIR_RATE",
        20.0,
        "Metered calls per second one non-admin principal may start (token bucket, per gateway: each of "
        "N workers holds 1/N); beyond it that principal alone gets 429 `rate_limited`. 0: no rate limit.",
        tradeoff="Size it to the share of the service one principal may take: about 10% of the searches/s "
        "the host serves keeps a flood from others' latency; the default suits a GPU host.",
    )
    fair_burst: int = setting(
        "RAG_FAIR_BURST", 40, "Calls a principal may start at once above `RAG_FAIR_RATE` (bucket size)."
    )
    fair_concurrency: int = setting(
        "RAG_FAIR_CONCURRENCY",
        8,
        "Metered calls one non-admin principal may have in flight (the sidecar and the language model "
        "serve the others meanwhile); beyond it, 429 `rate_limited`. 0: no bound.",
    )
    durable_commit: bool = setting(
        "RAG_BUDGET_DURABLE_COMMIT",
        False,
        "Wait for each ledger write to reach the disk (PostgreSQL's `synchronous_commit`) before the "
        "metered call goes on. Off: the write is visible to every other reservation at once (the limit "
        "holds under any concurrency) and reaches the disk within PostgreSQL's `wal_writer_delay`.",
        tradeoff="Off saves a disk flush per metered call (about a tenth of a search's median here); a "
        "PostgreSQL or host crash may then forget the last fraction of a second of use (an under-count, "
        "never a refusal). On: nothing counted is ever forgotten.",
    )
    fair_admins: bool = setting(
        "RAG_FAIR_ADMINS",
        False,
        "Apply the fairness limiter to admin tokens too (off: the operator's and benchmarks' admin "
        "token is never shed).",
    )
    fair_exempt: tuple[str, ...] = setting(
        "RAG_FAIR_EXEMPT",
        (),
        "Comma-separated principals (token `sub`s) the fairness limiter never sheds, as it never sheds "
        "admins: a load test's callers, a trusted batch service. Their budgets still apply (`mnemo "
        "budgets set` gives one its own).",
        tradeoff="Each one named may take as much of the service as it can drive: name only principals "
        "whose load is the point (a load test) or is bounded elsewhere.",
    )

    @property
    def role_limits(self) -> dict[tuple[str, str], int]:
        return parse_limits(self.limits)

    def validate(self) -> None:
        parse_limits(self.limits)
        if self.window < 1:
            raise SettingsError("RAG_BUDGET_WINDOW must be at least 1 (seconds)")
        if self.ask_grant not in ASK_GRANT_MODES:
            raise SettingsError(f"RAG_ASK_GRANT={self.ask_grant!r}: use one of {', '.join(ASK_GRANT_MODES)}")
        if not self.fair_rate >= 0 or self.fair_rate == float("inf"):
            raise SettingsError("RAG_FAIR_RATE must be finite and >= 0")
        if self.fair_burst < 1 or self.fair_concurrency < 0:
            raise SettingsError("RAG_FAIR_BURST must be >= 1 and RAG_FAIR_CONCURRENCY >= 0")
        if self.lease < 1 or not 0 < self.lease_idle < float("inf"):
            raise SettingsError(
                "RAG_BUDGET_LEASE must be >= 1 and RAG_BUDGET_LEASE_IDLE a number of seconds > 0"
            )
