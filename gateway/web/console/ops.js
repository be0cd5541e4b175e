// Operations (admins): readiness, the lexical engine per partition, queue, failed records with a
// retry button, models, sections, and budgets (use of this window per principal and meter; set a
// principal's limit, reset its window).

import { get, getOpenAI, post } from "./api.js";
import { $, clear, el, showError } from "./dom.js";

const json = (value) => JSON.stringify(value, null, 2);

// An object as a definition list, nested keys joined with dots (drain.state, faiss.mode).
function facts(value, prefix = "") {
  const out = [];
  for (const [key, item] of Object.entries(value)) {
    const name = prefix + key;
    if (item !== null && typeof item === "object" && !Array.isArray(item)) out.push(...facts(item, `${name}.`));
    else out.push(el("dt", {}, name), el("dd", {}, item === null ? "—" : String(item)));
  }
  return out;
}

function row(...cells) {
  return el("tr", {}, cells.map((c) => el("td", {}, c === null || c === undefined ? "—" : String(c))));
}

async function settle(target, load, render) {
  try {
    render(await load());
  } catch (failure) {
    clear(target, `${failure.labelKey}: ${failure.message}`);
    showError("ops", failure);
  }
}

export async function refreshOps() {
  showError("ops", null);
  await Promise.all([
    settle($("#ops-ready"), () => get("/readyz"), (d) => {
      // The lexical engine's detail and the vector snapshots get their own tables below, from this
      // same answer.
      const { snapshots, ...cache } = d.faiss;
      const shown = { ...d, faiss: cache };
      delete shown.lexical_index;
      clear($("#ops-ready"), facts(shown));
      renderLexical(d.lexical_index);
      renderSnapshots(d.faiss.mode, snapshots, cache.partitions || {});
    }),
    settle($("#ops-queue"), () => get("/v1/queue/stats"), (d) => clear($("#ops-queue"), facts(d))),
    settle($("#ops-failed tbody"), () => get("/v1/queue/failed"), (d) =>
      clear(
        $("#ops-failed tbody"),
        d.failed.length
          ? d.failed.map((r) => row(`${r.section_tipo} ${r.section_id}`, r.operation, r.attempts, r.last_error))
          : row("No failed record", "", "", ""),
      ),
    ),
    settle($("#ops-models tbody"), () => getOpenAI("/v1/models"), (d) =>
      clear(
        $("#ops-models tbody"),
        d.data.map((m) =>
          row(m.id, m.kind, m.capabilities.join(", "), m.dimension, m.max_input_tokens, m.device, m.dtype),
        ),
      ),
    ),
    settle($("#ops-sections"), () => get("/v1/sections"), (d) => clear($("#ops-sections"), json(d.sections))),
    settle($("#ops-budgets tbody"), () => get("/v1/budgets"), renderBudgets),
  ]);
}

// Every index folder's state is one of index.follow.folder_state's: ready, building, behind,
// missing, foreign (/readyz names them as `mnemo lexical status` and `mnemo vectors status` do).

// RAG_LEXICAL_INDEX and, per partition, what serves its lexical leg: the engine when its index is
// ready (caught up), the SQL leg while it is missing, building, behind or another store's.
const ENGINES = { auto: "Tantivy", tantivy: "Tantivy" };

function renderLexical(lexical) {
  const engine = ENGINES[lexical.mode];
  clear(
    $("#ops-lexical-mode"),
    engine
      ? `Mode ${lexical.mode}${lexical.root ? `, indexes in ${lexical.root}` : ""}; a partition not ready is served by the SQL leg`
      : `Mode ${lexical.mode}: the SQL leg serves every search`,
  );
  const partitions = Object.entries(lexical.partitions || {});
  clear(
    $("#ops-lexical tbody"),
    partitions.length
      ? partitions.map(([name, p]) =>
          row(name, p.state === "ready" ? engine : "SQL leg", p.state, p.seq, p.documents, p.behind, p.age_s),
        )
      : row(engine ? "No partition in the store yet" : "—", "SQL leg", "", "", "", "", ""),
  );
}

// RAG_FAISS_CACHE=mmap: per partition, its snapshot's state and what serves its dense leg (the
// worker's cache when it mapped the snapshot, pgvector otherwise).
function renderSnapshots(mode, snapshots, cached) {
  clear(
    $("#ops-vectors-mode"),
    snapshots
      ? `Mode ${mode}: every worker maps the snapshots \`mnemo vectors follow\` writes`
      : `Mode ${mode}: no snapshots (RAG_FAISS_CACHE=mmap maps them)`,
  );
  const rows = Object.entries(snapshots || {});
  clear(
    $("#ops-vectors tbody"),
    rows.length
      ? rows.map(([name, s]) =>
          row(name, cached[name]?.state === "ready" ? "FAISS cache" : "pgvector", s.state, s.seq, s.vectors, s.behind),
        )
      : row("—", "", "", "", "", ""),
  );
}

function renderBudgets(d) {
  const meter = $("#budget-meter");
  if (!meter.options.length) d.meters.forEach((m) => meter.append(el("option", { value: m }, m)));
  const roles = d.limits.map((l) => `${l.role}.${l.meter}=${l.limit}`).join(", ") || "none";
  clear($("#ops-budget-window"), `Window ${d.window_s} s (UTC)${d.enabled ? "" : ", metering off"}; role limits: ${roles}`);
  clear(
    $("#ops-budgets tbody"),
    d.rows.length
      ? d.rows.map((r) =>
          row(r.principal, r.meter, r.role, r.used, `${r.limit === null ? "unlimited" : r.limit}${r.override ? " (own)" : ""}`),
        )
      : row("No use in this window", "", "", "", ""),
  );
}

// One budget change, then the table again and a line saying what was done.
async function budgetChange(path, body, done) {
  showError("ops", null);
  try {
    await post(path, body);
    await refreshOps();
    clear($("#ops-budget-done"), done);
  } catch (failure) {
    showError("ops", failure);
  }
}

function budgetTarget() {
  return { principal: $("#budget-principal").value.trim(), meter: $("#budget-meter").value };
}

export function setupOps() {
  $("#ops-refresh").addEventListener("click", refreshOps);
  $("#ops-budget-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const raw = $("#budget-limit").value.trim();
    const target = budgetTarget();
    const limit = raw === "" ? null : Number(raw);
    const shown = limit === null ? "unlimited" : limit;
    budgetChange("/v1/budgets/limit", { ...target, limit }, `${target.principal} ${target.meter}: ${shown}`);
  });
  $("#budget-default").addEventListener("click", () => {
    const target = budgetTarget();
    budgetChange("/v1/budgets/limit", { ...target, default: true }, `${target.principal} ${target.meter}: role default`);
  });
  $("#budget-reset").addEventListener("click", () => {
    const { principal } = budgetTarget();
    budgetChange("/v1/budgets/reset", { principal }, `${principal}: window reset`);
  });
  $("#ops-retry").addEventListener("click", async () => {
    showError("ops", null);
    try {
      const { retried } = await post("/v1/queue/retry", {});
      await refreshOps();
      clear($("#ops-retried"), `${retried} records queued again`);
    } catch (failure) {
      showError("ops", failure);
    }
  });
}
