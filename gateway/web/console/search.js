// Search: passages best matching a query (retrieve), paginated here, each opening in the passage panel.

import { action } from "./api.js";
import { $, clear, el, marked, showError } from "./dom.js";
import { openPassage } from "./passage.js";

const PAGE = 10;
let hits = [];
let page = 0;
let lastQuery = "";

export function tipos(value) {
  const list = value.split(",").map((t) => t.trim()).filter(Boolean);
  return list.length ? list : undefined;
}

function hitItem(hit, query) {
  const facts = [`score ${hit.score.toFixed(4)}`];
  if (hit.reranked !== undefined) {
    facts.push(hit.reranked ? `reranked (cross-encoder ${hit.rerank_score.toFixed(3)})` : "not reranked");
  }
  facts.push(`legs: ${Object.entries(hit.legs).map(([leg, rank]) => `${leg} #${rank}`).join(", ")}`);
  return el(
    "li",
    {},
    el(
      "button",
      { type: "button", class: "hit", "data-chunk-id": hit.chunk_id, onclick: () => openPassage(hit.chunk_id) },
      el("span", { class: "hit-title" }, hit.title || `${hit.section_tipo} ${hit.section_id}`),
      el("span", { class: "hit-section" }, `${hit.section_tipo} ${hit.section_id}${hit.group ? ` · ${hit.group}` : ""}`),
      el("span", { class: "hit-snippet" }, marked(hit.snippet, query)),
      el("span", { class: "hit-score" }, facts.join(" · ")),
    ),
  );
}

function render() {
  const pages = Math.max(1, Math.ceil(hits.length / PAGE));
  clear($("#search-results"), hits.slice(page * PAGE, (page + 1) * PAGE).map((h) => hitItem(h, lastQuery)));
  $("#search-results").start = page * PAGE + 1;
  $("#search-pager").hidden = hits.length <= PAGE;
  clear($("#search-page"), `Page ${page + 1} of ${pages}`);
  $("#search-prev").disabled = page === 0;
  $("#search-next").disabled = page + 1 >= pages;
}

async function search(event) {
  event.preventDefault();
  showError("search", null);
  lastQuery = $("#search-query").value;
  // explain: each hit names its rank in each retrieval leg (what fusion combined).
  const options = { query: lastQuery, limit: Number($("#search-limit").value) || 10, explain: true };
  const sections = tipos($("#search-section").value);
  if (sections) options.section_tipo = sections;
  if ($("#search-group").value.trim()) options.group = $("#search-group").value.trim();
  if ($("#search-rerank").checked) options.rerank = true;
  clear($("#search-status"), "Searching…");
  try {
    hits = (await action("retrieve", options)).data;
    page = 0;
    const reranked = options.rerank ? "reranked by the cross-encoder" : "fused, not reranked";
    clear($("#search-status"), `${hits.length} passages (${reranked})`);
    render();
  } catch (failure) {
    hits = [];
    render();
    clear($("#search-status"));
    showError("search", failure);
  }
}

export function setupSearch() {
  $("#search-form").addEventListener("submit", search);
  $("#search-prev").addEventListener("click", () => {
    page -= 1;
    render();
  });
  $("#search-next").addEventListener("click", () => {
    page += 1;
    render();
  });
}
