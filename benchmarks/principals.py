"""The harness's own non-admin principals, configured as an operator configures a load test's.

A suite that loops a non-admin principal's calls (the gateway suite's selectivity callers, the scale
suite's 1% researcher) measures the service, not the fairness limiter or the day's budget: the
product's defaults (``RAG_FAIR_RATE`` 20 calls/s, ``user.query_embeddings`` 10,000 a day) would shed
it. So each such principal is set up as an operator sets up a load test's: the gateway the suite
starts names it in ``RAG_FAIR_EXEMPT`` (the limiter never sheds it, as it never sheds the admin
token), and the ledger gives it its own unlimited budget on every meter (what ``mnemo budgets set
--unlimited`` writes; its calls are still counted). Every other principal keeps the defaults: the
reliability suite's flood measures them.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["grant_load_test_budgets", "load_test_env"]


def load_test_env(principals: Sequence[str]) -> dict[str, str]:
    """The gateway settings that exempt ``principals`` (token ``sub``s) from the fairness limiter."""
    return {"RAG_FAIR_EXEMPT": ",".join(principals)} if principals else {}


async def grant_load_test_budgets(database_url: str, principals: Sequence[str]) -> None:
    """Give each of ``principals`` no limit on any meter in the ledger of ``database_url``."""
    from gateway.base.budget_settings import METERS, BudgetSettings
    from gateway.budgets import admin as budget_admin
    from gateway.budgets.ledger import Ledger
    from schema import create_pool

    if not principals:
        return
    pool = await create_pool(database_url, max_size=1)
    try:
        ledger = Ledger(pool, BudgetSettings())
        for principal in principals:
            for meter in METERS:
                await budget_admin.set_limit(ledger, principal, meter, None)
    finally:
        await pool.close()
