"""The demo that `mnemo up` prints must tell the truth: every example answers as its story says."""

from __future__ import annotations

import pytest

from gateway.run.up import DEMO_EXAMPLES, RESEARCHER_PERMS, RESEARCHER_PROJECTS, examples
from index.demo import demo_records, demo_sections
from tests.fixtures.gateway import ADMIN, running_gateway, token

pytestmark = pytest.mark.ray


async def test_every_printed_example_answers_as_the_demo_says(database_url: str, sidecar_url: str) -> None:
    researcher = token("researcher", projects=RESEARCHER_PROJECTS, **RESEARCHER_PERMS)
    bearers = {"ADMIN": ADMIN, "RESEARCHER": researcher}
    async with running_gateway(database_url, sidecar_url) as gw:
        await gw.ingest(demo_sections(), demo_records())
        for example in DEMO_EXAMPLES:
            data = await gw.ok(example.action, example.options, bearer=bearers[example.token_var])
            if example.expect_empty:
                assert data == {"groups": []}, (example, data)
                continue
            assert data, f"{example.token_var} {example.action} {example.options} answered nothing"
            if example.action == "ask":  # a grounded, cited answer; its citations are the hits
                assert data["grounded"] and data["citations"], (example, data)
                data = [{"section_tipo": c["sectionTipo"]} for c in data["citations"]]
            if example.token_var == "RESEARCHER":
                sections = {hit["section_tipo"] for hit in data}
                assert sections <= {"oh1", "numisdata4"}, (example, sections)
        # The researcher's similar_to seed is readable, so its neighbours are other coins they may read.
        neighbours = await gw.ok(
            "similar_to", {"section_tipo": "numisdata4", "section_id": 101, "limit": 3}, bearer=researcher
        )
        assert neighbours and all(hit["section_tipo"] == "numisdata4" for hit in neighbours)
        assert 101 not in {hit["section_id"] for hit in neighbours}


def test_the_printed_tokens_come_with_the_console_address() -> None:
    printed = examples("http://127.0.0.1:8080", "admin-token", "researcher-token").splitlines()
    tokens = printed.index("  export RESEARCHER=researcher-token")
    console = next(i for i, line in enumerate(printed) if "http://127.0.0.1:8080/console" in line)
    assert (
        "paste ADMIN or RESEARCHER" in printed[console] and "http://127.0.0.1:8080/docs" in printed[console]
    )
    assert console > tokens
