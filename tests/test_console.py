"""The console and /docs in a real browser (headless Chromium through Selenium) against a real gateway,
the session Ray Serve sidecar and an embedded PostgreSQL holding a small oral-history collection, a
forbidden section, a record with a hostile title, and coins with thumbnails.

The gateway serves on this test's event loop, so every browser step runs in a worker thread
(``asyncio.to_thread``): a blocking WebDriver call on the loop would stall the very server it waits for.
Each flow saves a screenshot (see ``screenshots`` in tests/fixtures/browser.py).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from PIL import Image
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from gateway.base.resources import POOL_KEY
from gateway.web.console import CONTENT_SECURITY_POLICY
from index.bulk.image_jobs import JobOptions, run_image_job
from index.settings import MediaSettings
from inference.client import SidecarClient
from tests.fixtures.gateway import (
    ADMIN,
    DESCRIPTORS,
    Doc,
    Gateway,
    index_docs,
    put_sections,
    running_gateway,
    seeded_database,
    token,
)
from tests.image_support import COIN_SECTION, COINS, IMAGE_MODEL

XSS_TITLE = "<img src=x onerror=alert(1)>"
FORBIDDEN_WORD = "Quetzalcoatl"  # only in the forbidden section's record
RESEARCHER = token("researcher", projects=[1], oh1=1, coins1=1)
WAIT_S = 120  # the most a step waits for the page (a bound on a hang, not a speed claim)

DOCS = [
    *[
        Doc(
            "oh1",
            1,
            text,
            group="transcript",
            contributors=["oh23"],
            chunk_index=i,
            title="Interview with Rosa, Riaño",
            heading_path=["Interview", f"Part {i + 1}"],
            page=i + 1,
        )
        for i, text in enumerate(
            [
                "We kept sheep on the hillside above the river, like my father before me.",
                "When the water came we had to leave the village; the reservoir flooded the houses.",
                "Later we settled in León, but every summer we walk down to the drowned church.",
            ]
        )
    ],
    Doc("oh1", 2, "The reservoir flooded the valley and families were displaced.", title="Interview 2"),
    Doc("oh1", 9, "A flood marker stone stands near the church door.", title=XSS_TITLE),
    Doc(
        "sec9",
        1,
        f"The {FORBIDDEN_WORD} ledger records who had to leave when the flood water came.",
        title="Closed ledger",
    ),
]
SECTIONS = {**DESCRIPTORS, "sec9": {"embed": [{"id": "card", "contributors": ["c1"]}]}}


@pytest.fixture(scope="module")
async def console_database(
    pg_server: Any, template_db: str, sidecar_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    """The collection above, and every fourth of the coins data set's first 96 photographs (24) with
    their thumbnails."""
    manifest = tmp_path_factory.mktemp("console-coins") / "manifest.jsonl"
    lines = [json.loads(x) for x in (COINS / "manifest.jsonl").read_text().splitlines() if x.strip()]
    manifest.write_text(
        "".join(json.dumps({**x, "path": str(COINS / x["path"])}) + "\n" for x in lines[::4][:24])
    )

    async def seed(pool: asyncpg.Pool) -> None:
        await index_docs(pool, sidecar_url, DOCS)
        await put_sections(pool, {**SECTIONS, "coins1": COIN_SECTION})
        async with SidecarClient(sidecar_url) as client:
            # The manifest names the photographs where they lie: that folder is the job's media root.
            media = MediaSettings(media_root=str(COINS), image_max_px=64, thumbnail_px=96)
            rejects = manifest.with_suffix(".rejects.jsonl")  # beside the manifest, not in the cwd
            options = JobOptions(
                "coins1", projects=(1,), workers=2, batch_size=8, media=media, rejects=rejects
            )
            report = await run_image_job(pool, client, manifest, options)
        assert (report.embedded, report.rejected) == (24, 0), report

    async with seeded_database(pg_server, template_db, seed) as url:
        yield url


@pytest.fixture(scope="module")
async def gateway(console_database: str, sidecar_url: str) -> AsyncIterator[Gateway]:
    async with running_gateway(
        console_database, sidecar_url, RAG_MEDIA_ENABLED="true", RAG_IMAGE_MODEL=IMAGE_MODEL
    ) as gw:
        yield gw


# -- driving the page ------------------------------------------------------------------------------


def wait(driver: WebDriver, condition: Callable[[WebDriver], Any]) -> Any:
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition)


def _refresh(driver: WebDriver) -> bool:
    """Click the operations tab's refresh button (at most every 2 s); never the awaited state."""
    time.sleep(2)
    driver.find_element(By.ID, "ops-refresh").click()
    return False


def visible(driver: WebDriver, selector: str) -> Any:
    def shown(d: WebDriver) -> Any:
        found = d.find_elements(By.CSS_SELECTOR, selector)
        return found[0] if found and found[0].is_displayed() else False

    return wait(driver, shown)


def sign_in(driver: WebDriver, url: str, bearer: str | None) -> None:
    """A fresh console (nothing kept from an earlier test) signed in with ``bearer``."""
    driver.get(url + "/console")
    driver.execute_script("sessionStorage.clear()")
    driver.get(url + "/console")
    if bearer is not None:
        visible(driver, "#token").send_keys(bearer)
        driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
    visible(driver, "#app")


def fill(driver: WebDriver, selector: str, text: str) -> None:
    field = visible(driver, selector)
    field.clear()
    field.send_keys(text)


def tab(driver: WebDriver, name: str) -> None:
    driver.find_element(By.ID, f"tab-{name}").click()
    visible(driver, f"#panel-{name}")


def search(driver: WebDriver, query: str) -> list[Any]:
    fill(driver, "#search-query", query)
    driver.find_element(By.CSS_SELECTOR, "#search-form button").click()
    wait(driver, lambda d: "passages" in d.find_element(By.ID, "search-status").text)
    return driver.find_elements(By.CSS_SELECTOR, "#search-results .hit")


def ask(driver: WebDriver, question: str) -> None:
    tab(driver, "ask")
    fill(driver, "#ask-query", question)
    driver.find_element(By.CSS_SELECTOR, "#ask-form button").click()
    wait(driver, lambda d: d.find_element(By.ID, "ask-status").text.startswith("Done"))


def shot(driver: WebDriver, folder: Path, name: str, colors: int = 256) -> Path:
    """The viewport as ``<folder>/<name>.png``, reduced to a palette (the README's stay small)."""
    path = folder / f"{name}.png"
    with Image.open(io.BytesIO(driver.get_screenshot_as_png())) as image:
        image.convert("RGB").quantize(colors=colors).save(path, optimize=True)
    return path


def csp_refusals(driver: WebDriver) -> list[str]:
    """The Content-Security-Policy violations Chromium logged since the last call."""
    return [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]


def similar_shown(driver: WebDriver) -> list[str]:
    """The similar objects listed (their captions' first line), once the list has been redrawn."""
    wait(driver, lambda d: d.find_element(By.ID, "characterization").text != "Loading…")
    return [li.text.split(" · ")[0] for li in driver.find_elements(By.CSS_SELECTOR, "#similar-grid li")]


def no_alert(driver: WebDriver) -> bool:
    try:
        driver.switch_to.alert  # noqa: B018 - raises when no alert is open
    except NoAlertPresentException:
        return True
    return False


async def in_browser(flow: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(flow, *args)


# -- the flows -------------------------------------------------------------------------------------


async def test_sign_in_search_and_open_a_passage(
    browser: WebDriver, gateway: Gateway, screenshots: Path
) -> None:
    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)
        assert "Signed in as root (admin)" in browser.find_element(By.ID, "who").text
        hits = search(browser, "when the water came we had to leave")
        first = hits[0]
        assert first.find_element(By.CLASS_NAME, "hit-title").text == "Interview with Rosa, Riaño"
        assert first.find_element(By.CLASS_NAME, "hit-section").text.startswith("oh1 1")
        marks = {m.text.lower() for m in first.find_elements(By.TAG_NAME, "mark")}
        assert {"water", "came", "leave"} <= marks
        facts = first.find_element(By.CLASS_NAME, "hit-score").text
        assert facts.startswith("score ") and "dense #1" in facts and "lexical #" in facts
        first.click()
        cited = visible(browser, "#passage-body .cited")
        assert cited.text.startswith("When the water came")
        # The neighbours of the cited passage, and where it sits.
        context = [p.text for p in browser.find_elements(By.CSS_SELECTOR, "#passage-body .context")]
        assert context[0].startswith("We kept sheep") and context[1].startswith("Later we settled")
        assert "Interview › Part 2 · page 2" in browser.find_element(By.ID, "passage-where").text
        shot(browser, screenshots, "search-passage")
        assert csp_refusals(browser) == []  # the console itself needs nothing the policy refuses

    await in_browser(flow)


async def test_ask_then_a_citation_opens_its_passage(
    browser: WebDriver, gateway: Gateway, screenshots: Path
) -> None:
    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)
        ask(browser, "Why did the families have to leave the village?")
        assert browser.find_element(By.ID, "ask-outcome").text == "Answered from the passages below."
        assert "Provider extractive" in browser.find_element(By.ID, "ask-provider").text
        cite = visible(browser, "#ask-text a.cite")
        chunk_id = cite.get_attribute("data-chunk-id")
        assert chunk_id.startswith("oh1-")
        cite.click()
        cited = visible(browser, "#passage-body .cited")
        wait(browser, lambda d: cited.get_attribute("data-chunk-id") == chunk_id)
        # The passage the answer quotes, with the title its source line shows.
        n = int(cite.get_attribute("data-n"))
        source = browser.find_elements(By.CSS_SELECTOR, "#ask-sources li button")[n - 1].text
        assert browser.find_element(By.ID, "passage-title").text == source
        shot(browser, screenshots, "ask-citation")

    await in_browser(flow)


async def test_objects_similar_and_characterized(
    browser: WebDriver, gateway: Gateway, screenshots: Path
) -> None:
    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)
        tab(browser, "objects")
        fill(browser, "#objects-section", "coins1")
        fill(browser, "#objects-query", "a bronze coin")
        browser.find_element(By.CSS_SELECTOR, "#objects-form button").click()
        wait(browser, lambda d: d.find_element(By.ID, "objects-status").text == "24 objects")
        # Thumbnails arrive as blobs fetched with the token, and decode as images.
        loaded = "return [...document.querySelectorAll(arguments[0])].filter(i => i.naturalWidth > 0).length"
        wait(browser, lambda d: d.execute_script(loaded, "#objects-grid img") == 24)
        assert (
            browser.find_element(By.CSS_SELECTOR, "#objects-grid img")
            .get_attribute("src")
            .startswith("blob:")
        )
        browser.find_elements(By.CSS_SELECTOR, "#objects-grid .tile button")[0].click()
        wait(browser, lambda d: d.execute_script(loaded, "#similar-grid img") > 0)
        proposals = visible(browser, "#characterization .proposals").text
        assert "denomination:" in proposals and "confidence" in proposals
        wait(browser, lambda d: d.execute_script(loaded, "#characterization img") > 0)
        browser.set_window_size(1280, 1200)  # the grid, the similar objects and the characterization
        try:
            browser.execute_script("window.scrollTo(0, 0)")
            shot(browser, screenshots, "objects", colors=128)
        finally:
            browser.set_window_size(1280, 900)
        # Near-duplicates only: a part of the same list. The seed's own view (the coins have only
        # their obverse): the same list; a view it lacks: its seed is unknown, said by label_key.
        every = similar_shown(browser)
        browser.find_element(By.ID, "similar-dup").click()
        browser.find_element(By.CSS_SELECTOR, "#similar-form button").click()
        near = similar_shown(browser)
        assert near and set(near) < set(every)
        browser.find_element(By.ID, "similar-dup").click()
        view = Select(browser.find_element(By.ID, "similar-view"))
        view.select_by_value("obverse")
        browser.find_element(By.CSS_SELECTOR, "#similar-form button").click()
        assert similar_shown(browser) == every
        view.select_by_value("reverse")
        browser.find_element(By.CSS_SELECTOR, "#similar-form button").click()
        error = visible(browser, '[data-error="detail"]')
        assert error.find_element(By.CLASS_NAME, "label-key").text == "error.request.invalid_options"
        assert "Unknown seed record" in error.text and similar_shown(browser) == []

    await in_browser(flow)


async def test_a_researcher_sees_nothing_of_a_forbidden_section(
    browser: WebDriver, gateway: Gateway, screenshots: Path
) -> None:
    question = "who had to leave when the flood water came"

    def flow(bearer: str) -> str:
        sign_in(browser, gateway.url, bearer)
        hits = search(browser, question)
        assert hits, "the search found nothing at all"
        ask(browser, question)
        return browser.page_source

    # The control: an admin does see the record, so the check below can fail.
    assert FORBIDDEN_WORD in await in_browser(flow, ADMIN)
    page = await in_browser(flow, RESEARCHER)
    assert FORBIDDEN_WORD not in page and "sec9" not in page and "Closed ledger" not in page

    def refused_in_words() -> None:
        # Asked within the forbidden section alone, nothing readable remains: a refusal, said so.
        fill(browser, "#ask-section", "sec9")
        ask(browser, question)
        refusal = "No passage you may read answers this question, so no answer was generated."
        assert browser.find_element(By.ID, "ask-outcome").text == refusal
        assert browser.find_element(By.ID, "ask-provider").text == "No model was called"
        assert FORBIDDEN_WORD not in browser.page_source

    await in_browser(refused_in_words)

    def operations_hidden() -> None:
        assert "researcher" in browser.find_element(By.ID, "who").text
        assert not browser.find_element(By.ID, "tab-ops").is_displayed()
        shot(browser, screenshots, "researcher")

    await in_browser(operations_hidden)


async def test_a_hostile_title_renders_inert(browser: WebDriver, gateway: Gateway, screenshots: Path) -> None:
    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)
        hits = search(browser, "flood marker stone near the church")
        titles = [h.find_element(By.CLASS_NAME, "hit-title").text for h in hits]
        assert XSS_TITLE in titles
        hits[titles.index(XSS_TITLE)].click()
        wait(browser, lambda d: d.find_element(By.ID, "passage-title").text == XSS_TITLE)
        assert browser.find_elements(By.CSS_SELECTOR, "#search-results img, #passage img") == []
        assert no_alert(browser)
        shot(browser, screenshots, "hostile-title")

    await in_browser(flow)


async def test_the_csp_holds_and_no_inline_script_runs(browser: WebDriver, gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ("/console", "/console/console.js", "/docs"):
            async with s.get(gateway.url + path) as r:
                assert r.status == 200
                assert r.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
                assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY

    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)
        browser.get_log("browser")  # drop what came before
        browser.execute_script(
            "const s = document.createElement('script');"
            "s.textContent = 'window.inlineRan = true';"
            "document.body.append(s);"
        )
        assert browser.execute_script("return window.inlineRan === undefined")
        logged = " ".join(entry["message"] for entry in browser.get_log("browser"))
        assert "Content Security Policy" in logged, logged

    await in_browser(flow)


async def test_failures_show_their_label_key(browser: WebDriver, gateway: Gateway) -> None:
    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)
        fill(browser, "#search-group", "Not A Group!")
        fill(browser, "#search-query", "water")
        browser.find_element(By.CSS_SELECTOR, "#search-form button").click()
        error = visible(browser, '[data-error="search"]')
        assert error.find_element(By.CLASS_NAME, "label-key").text == "error.request.invalid_options"
        assert "group is not a valid embed-group id" in error.text
        # A bad token is refused at sign-in, in words.
        browser.get(gateway.url + "/console")
        browser.execute_script("sessionStorage.clear()")
        browser.get(gateway.url + "/console")
        fill(browser, "#token", "not-a-token")
        browser.find_element(By.CSS_SELECTOR, "#signin-form button").click()
        error = visible(browser, '[data-error="signin"]')
        assert error.find_element(By.CLASS_NAME, "label-key").text.startswith("error.auth.")

    await in_browser(flow)


async def test_operations_for_admins(browser: WebDriver, gateway: Gateway, screenshots: Path) -> None:
    # A record parked after its last attempt (as the drain leaves one), for the failed list and retry.
    await gateway.app[POOL_KEY].execute(
        """INSERT INTO rag_index_queue (section_tipo, section_id, operation, attempts, last_error)
           VALUES ('oh1', 77, 'delete', 5, 'sidecar: 422 input.too_long')"""
    )

    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)
        tab(browser, "ops")
        wait(browser, lambda d: "all-minilm-l6-v2" in d.find_element(By.ID, "ops-models").text)
        assert IMAGE_MODEL in browser.find_element(By.ID, "ops-models").text
        # The sections come from their own request, which may land after the models' on a busy machine.
        wait(browser, lambda d: '"coins1"' in d.find_element(By.ID, "ops-sections").text)
        # /readyz answers for the moment of its call (a sidecar slower than the 5 s readiness bound
        # reads as unreachable on a loaded machine) and the page shows that one answer: refreshed,
        # as an operator would, until it says ready.
        wait(browser, lambda d: "status\nready" in d.find_element(By.ID, "ops-ready").text or _refresh(d))
        # The lexical engine from the same /readyz: the default mode, and no index built for this
        # store, so the SQL leg serves its partition.
        assert "Mode auto" in browser.find_element(By.ID, "ops-lexical-mode").text
        assert "SQL leg" in browser.find_element(By.ID, "ops-lexical").text
        wait(browser, lambda d: "oh1 77" in d.find_element(By.ID, "ops-failed").text)
        assert "sidecar: 422 input.too_long" in browser.find_element(By.ID, "ops-failed").text
        shot(browser, screenshots, "operations")
        browser.find_element(By.ID, "ops-retry").click()
        wait(browser, lambda d: d.find_element(By.ID, "ops-retried").text == "1 records queued again")

    await in_browser(flow)


async def test_budgets_on_the_operations_page(
    browser: WebDriver, gateway: Gateway, screenshots: Path
) -> None:
    """An admin sees this window's use per principal, gives one principal its own limit (which the
    next call meets as 429 budget_exhausted), resets its window and puts the role's limit back. The
    principal's name is markup: the page must show it as text, never parse it."""
    sub = "<b>budget</b>-reader"
    reader = token(sub, projects=[1], oh1=1)
    assert (await gateway.call("semantic_search", {"query": "water"}, bearer=reader))[0] == 200

    def set_limit(limit: str) -> None:
        fill(browser, "#budget-principal", sub)
        Select(browser.find_element(By.ID, "budget-meter")).select_by_value("query_embeddings")
        fill(browser, "#budget-limit", limit)
        browser.find_element(By.ID, "budget-set").click()

    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)
        tab(browser, "ops")
        wait(browser, lambda d: sub in d.find_element(By.ID, "ops-budgets").text)
        assert not browser.find_elements(By.CSS_SELECTOR, "#ops-budgets b"), "the name was parsed as HTML"
        assert "Window 86400 s (UTC)" in browser.find_element(By.ID, "ops-budget-window").text
        set_limit("1")
        wait(browser, lambda d: d.find_element(By.ID, "ops-budget-done").text == f"{sub} query_embeddings: 1")
        wait(
            browser,
            lambda d: f"{sub} query_embeddings user 1 1 (own)" in d.find_element(By.ID, "ops-budgets").text,
        )
        shot(browser, screenshots, "operations-budgets")

    await in_browser(flow)
    status, body = await gateway.call("semantic_search", {"query": "water"}, bearer=reader)
    assert (status, body["error"]["code"], body["error"]["limit"]) == (429, "budget_exhausted", 1)

    def reset_and_default() -> None:
        browser.find_element(By.ID, "budget-reset").click()
        wait(browser, lambda d: d.find_element(By.ID, "ops-budget-done").text == f"{sub}: window reset")
        browser.find_element(By.ID, "budget-default").click()
        wait(
            browser,
            lambda d: (
                d.find_element(By.ID, "ops-budget-done").text == f"{sub} query_embeddings: role default"
            ),
        )
        assert "(own)" not in browser.find_element(By.ID, "ops-budgets").text

    await in_browser(reset_and_default)
    assert (await gateway.call("semantic_search", {"query": "water"}, bearer=reader))[0] == 200


async def test_keyboard_and_a_phone_wide_screen(
    browser: WebDriver, gateway: Gateway, screenshots: Path
) -> None:
    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)
        browser.set_window_size(390, 844)
        try:
            # Tabs move with the arrow keys; the search form submits with Enter.
            browser.find_element(By.ID, "tab-search").send_keys(Keys.ARROW_RIGHT)
            assert browser.switch_to.active_element.get_attribute("id") == "tab-ask"
            assert browser.find_element(By.ID, "panel-ask").is_displayed()
            browser.switch_to.active_element.send_keys(Keys.ARROW_LEFT)
            fill(browser, "#search-query", "reservoir flooded the valley")
            browser.find_element(By.ID, "search-query").send_keys(Keys.ENTER)
            wait(browser, lambda d: "passages" in d.find_element(By.ID, "search-status").text)
            # Nothing is wider than the screen.
            assert browser.execute_script("return document.documentElement.scrollWidth") <= 390
            labelled = "return [...document.querySelectorAll('input, select, textarea')].every(e => e.labels.length > 0)"
            assert browser.execute_script(labelled)
            shot(browser, screenshots, "phone")
        finally:
            browser.set_window_size(1280, 900)

    await in_browser(flow)


async def test_docs_render_and_try_it_answers(
    browser: WebDriver, gateway: Gateway, screenshots: Path
) -> None:
    def flow() -> None:
        sign_in(browser, gateway.url, ADMIN)  # the token the docs page picks up from this tab
        browser.get_log("browser")  # drop what came before
        browser.get(gateway.url + "/docs")
        visible(browser, "#operations-default-get_v1_whoami button.opblock-summary-control").click()
        visible(browser, "#operations-default-get_v1_whoami button.execute").click()
        body = visible(browser, "#operations-default-get_v1_whoami .live-responses-table .microlight")
        assert '"sub": "root"' in body.text and '"admin": true' in body.text
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", body)
        shot(browser, screenshots, "docs")
        assert csp_refusals(browser) == []  # Swagger UI needed nothing the policy refuses

    await in_browser(flow)


async def test_auth_off_says_admin_and_the_switch_turns_it_off(
    browser: WebDriver, console_database: str, sidecar_url: str
) -> None:
    async with running_gateway(console_database, sidecar_url, RAG_AUTH="off") as open_gateway:

        def flow() -> str:
            sign_in(browser, open_gateway.url, None)  # no token pasted
            return browser.find_element(By.ID, "who").text

        assert (await in_browser(flow)).startswith("Running as an admin: RAG_AUTH=off")
    async with (
        running_gateway(console_database, sidecar_url, RAG_CONSOLE_ENABLED="false") as closed,
        aiohttp.ClientSession() as s,
    ):
        for path in ("/console", "/console/console.js", "/docs", "/docs/swagger-ui.css"):
            async with s.get(closed.url + path) as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
        async with s.get(closed.url + "/v1/whoami", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert (await r.json())["data"]["sub"] == "root"


async def test_the_operations_routes_are_for_admins_only(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ("/v1/queue/failed", "/v1/sections", "/v1/budgets"):
            async with s.get(gateway.url + path, headers={"Authorization": f"Bearer {RESEARCHER}"}) as r:
                assert r.status == 403 and (await r.json())["error"]["code"] == "auth.forbidden", path
            async with s.get(gateway.url + path) as r:
                assert r.status == 401, path
        async with s.get(gateway.url + "/v1/whoami", headers={"Authorization": f"Bearer {RESEARCHER}"}) as r:
            me = (await r.json())["data"]
    assert me == {"sub": "researcher", "admin": False, "projects": [1], "auth": "jwt"}


async def test_everyone_lists_the_served_models_and_an_admin_sees_where_they_run(gateway: Gateway) -> None:
    """GET /v1/models is OpenAI's list for every caller of /v1/embeddings; the device and dtype are
    the operations page's (admins)."""
    listed = {}
    async with aiohttp.ClientSession() as s:
        for who, bearer in (("admin", ADMIN), ("researcher", RESEARCHER)):
            async with s.get(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {bearer}"}) as r:
                assert r.status == 200, await r.text()
                body = await r.json()
            assert body["object"] == "list"
            listed[who] = body["data"]
        async with s.get(gateway.url + "/v1/models") as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "auth.not_logged"
    models = listed["admin"]
    assert models and all(
        m["object"] == "model" and m["capabilities"] == sorted(m["capabilities"]) for m in models
    )
    assert all({"device", "dtype"} <= m.keys() for m in models)
    hidden = [{k: v for k, v in m.items() if k not in ("device", "dtype")} for m in models]
    assert listed["researcher"] == hidden
