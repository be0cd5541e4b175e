"""The lexical-leg Protocol and its implementations: an engine is matched structurally, so this
checks what a type checker would, at test time: every member the retriever and the app call is
there, async where the Protocol's is, and takes the Protocol's parameters (names and kinds)."""

from __future__ import annotations

import inspect

import pytest

from index.lexical.engine import TantivyLexical
from index.search.lexical_engine import LexicalEngine

MEMBERS = ("start", "stop", "status", "search")
# An engine that implements the Protocol joins this list.
ENGINES = [TantivyLexical]


def _accepts(implementation: inspect.Signature, contract: inspect.Signature) -> list[str]:
    """The Protocol's parameters the implementation does not take the same way (extra ones with
    defaults are fine: a caller of the Protocol never passes them)."""
    problems = []
    params = implementation.parameters
    for name, want in contract.parameters.items():
        got = params.get(name)
        if got is None or got.kind != want.kind:
            problems.append(f"{name} ({want.kind.description})")
        elif want.default is not inspect.Parameter.empty and got.default != want.default:
            problems.append(f"{name} default {got.default!r}, not {want.default!r}")
    extra = [
        p for n, p in params.items() if n not in contract.parameters and p.default is inspect.Parameter.empty
    ]
    problems += [f"{p.name} (required, not in the Protocol)" for p in extra]
    return problems


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
@pytest.mark.parametrize("member", MEMBERS)
def test_an_engine_has_the_protocols_members(engine: type, member: str) -> None:
    contract = getattr(LexicalEngine, member)
    implementation = getattr(engine, member)
    assert inspect.iscoroutinefunction(implementation) == inspect.iscoroutinefunction(contract)
    assert _accepts(inspect.signature(implementation), inspect.signature(contract)) == []
