"""One vocabulary for a partition's index folders (issue 57): each state of a lexical index and a
vector snapshot (``ready``, ``building``, ``behind``, ``missing``, ``foreign``: index.follow.folder_state)
made for real, then read from every surface that shows it (``mnemo lexical status`` and ``mnemo
vectors status`` as processes, ``/readyz`` of a real gateway mapping the snapshots, and the console's
operations page in Chromium), which must all say that state.

The states are made by what makes them in production: the writers build (``ready``), a build's
version folder exists before its first swap (``building``), changes are written with no writer
running (``behind``, past thresholds set low), nothing is built (``missing``), or the folders were
built from another database (``foreign``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from index.follow.folder_state import STATES
from index.follow.swap_folders import new_folder
from index.lexical.writer import LexicalWriter
from index.store.partitions import ModelPartition
from index.vectors.writer import VectorWriter
from schema import create_pool, migrate
from tests.conftest import REPO_ROOT
from tests.fixtures.gateway import ADMIN, CORPUS, Gateway, index_docs, running_gateway
from tests.test_console import _refresh, in_browser, sign_in, tab, wait
from tests.waiting import until

pytestmark = pytest.mark.ray

# Low thresholds, so that two changes past a folder's watermark make it `behind`; the same for
# every surface (the gateway's settings and the commands' environment).
THRESHOLDS = {"RAG_LEXICAL_MAX_BEHIND": "1", "RAG_VECTOR_SNAPSHOT_CHANGES": "1"}
KINDS = ("lexical", "vectors")


async def _build(database_url: str, roots: dict[str, Path], partition: ModelPartition) -> None:
    """What `mnemo lexical rebuild` and `mnemo vectors rebuild` do for one partition."""
    pool = await create_pool(database_url, max_size=2)
    try:
        for writer in (
            LexicalWriter(pool, database_url, roots["lexical"]),
            VectorWriter(pool, database_url, roots["vectors"]),
        ):
            try:
                await writer.rebuild(partition)
            finally:
                await writer.stop()
    finally:
        await pool.close()


async def _indexed(database_url: str, sidecar_url: str, docs: slice) -> ModelPartition:
    pool = await create_pool(database_url, max_size=2)
    try:
        return await index_docs(pool, sidecar_url, CORPUS[docs])
    finally:
        await pool.close()


@pytest.fixture
async def another_store(empty_database_url: str) -> AsyncIterator[str]:
    await migrate(empty_database_url)
    yield empty_database_url


async def _arrange(
    state: str, database_url: str, sidecar_url: str, roots: dict[str, Path], another: str
) -> ModelPartition:
    """The store's partition with both its folders in ``state``."""
    partition = await _indexed(database_url, sidecar_url, slice(0, 3))
    if state in ("ready", "behind"):
        await _build(database_url, roots, partition)
    if state == "behind":  # written while no writer runs: two changes past both watermarks
        await _indexed(database_url, sidecar_url, slice(3, 5))
    if state == "building":  # a build's version folder, before its first swap names it
        for root in roots.values():
            new_folder(root, partition)
    if state == "foreign":  # the same partition of another database, built into these folders
        await _build(another, roots, await _indexed(another, sidecar_url, slice(0, 3)))
    return partition


async def _command(kind: str, database_url: str, root: Path) -> str:
    """The partition's state as `mnemo <kind> status --json` says it, from a real process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", kind, "status", "--json", "--database-url", database_url,
        "--dir", str(root), stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT, env={**os.environ, **THRESHOLDS},
    )  # fmt: skip
    out, _ = await process.communicate()
    assert process.returncode == 0
    (shown,) = json.loads(out)["partitions"].values()
    return shown["state"]


async def _readyz(gw: Gateway) -> dict[str, str]:
    """Both folders' states in /readyz (asked until it answers 200: a loaded machine's sidecar can
    miss the readiness bound)."""

    async def answered() -> dict | None:
        async with aiohttp.ClientSession() as s, s.get(gw.url + "/readyz") as r:
            return (await r.json())["data"] if r.status == 200 else None

    data = await until("/readyz to answer", answered)
    (lexical,) = data["lexical_index"]["partitions"].values()
    (snapshot,) = data["faiss"]["snapshots"].values()
    return {"lexical": lexical["state"], "vectors": snapshot["state"]}


def _page(browser: WebDriver, url: str) -> dict[str, str]:
    """Both folders' states on the console's operations page (the State column of each table)."""

    def shown(table: str) -> str | None:
        # Read in one script: a refresh redraws the table between WebDriver calls.
        cells = browser.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(r => [...r.cells].map(c => c.textContent))",
            f"#{table} tbody tr",
        )
        states = [c[2] for c in cells if len(c) > 2 and c[0].startswith("rag_emb_")]
        return states[0] if len(states) == 1 else None

    sign_in(browser, url, ADMIN)
    tab(browser, "ops")
    wait(browser, lambda d: "status\nready" in d.find_element(By.ID, "ops-ready").text or _refresh(d))
    wait(browser, lambda d: shown("ops-lexical") and shown("ops-vectors"))
    return {"lexical": shown("ops-lexical") or "", "vectors": shown("ops-vectors") or ""}


@pytest.mark.parametrize("state", STATES)
async def test_an_index_folders_state_reads_the_same_on_every_surface(
    state: str, database_url: str, another_store: str, sidecar_url: str, browser: WebDriver, tmp_path: Path
) -> None:
    roots = {kind: tmp_path / kind for kind in KINDS}
    await _arrange(state, database_url, sidecar_url, roots, another_store)
    commands = {kind: await _command(kind, database_url, roots[kind]) for kind in KINDS}
    env = {"RAG_LEXICAL_DIR": str(roots["lexical"]), "RAG_VECTOR_DIR": str(roots["vectors"]), **THRESHOLDS}
    async with running_gateway(database_url, sidecar_url, RAG_FAISS_CACHE="mmap", **env) as gw:
        readyz = await _readyz(gw)
        page = await in_browser(_page, browser, gw.url)
    expected = dict.fromkeys(KINDS, state)
    assert (commands, readyz, page) == (expected, expected, expected)
