// The console's entry point: sign-in, the tabs, and wiring the panels.

import { ApiFailure, get, session } from "./api.js";
import { setupAsk } from "./ask.js";
import { $, clear, showError } from "./dom.js";
import { setupObjects } from "./objects.js";
import { refreshOps, setupOps } from "./ops.js";
import { setupPassage } from "./passage.js";
import { setupSearch } from "./search.js";

function describe(me) {
  if (me.auth === "off") return `Running as an admin: RAG_AUTH=off, nothing is checked (${me.sub})`;
  const projects = me.projects === null ? "every project" : `projects ${me.projects.join(", ") || "none"}`;
  return `Signed in as ${me.sub}${me.admin ? " (admin)" : ""} · ${projects}`;
}

// quiet: the silent attempt at load (no token kept), which only succeeds under RAG_AUTH=off.
async function signIn(token, quiet = false) {
  showError("signin", null);
  session.token = token;
  let me;
  try {
    me = await get("/v1/whoami");
  } catch (failure) {
    session.token = "";
    if (quiet) return;
    showError("signin", failure instanceof ApiFailure ? failure : { labelKey: "console.error", message: String(failure) });
    return;
  }
  clear($("#who"), describe(me));
  $("#signin").hidden = true;
  $("#app").hidden = false;
  $("#signout").hidden = false;
  $("#tab-ops").hidden = !me.admin;
  select($("#tab-search"));
}

function signOut() {
  session.token = "";
  location.reload();
}

// The tabs follow the WAI-ARIA pattern: arrow keys move between tabs, Enter or a click selects.
function tabs() {
  return [...document.querySelectorAll('[role="tab"]')].filter((t) => !t.hidden);
}

function select(tab) {
  for (const t of document.querySelectorAll('[role="tab"]')) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    document.getElementById(t.getAttribute("aria-controls")).hidden = !on;
  }
  if (tab.id === "tab-ops") refreshOps();
}

function setupTabs() {
  for (const tab of document.querySelectorAll('[role="tab"]')) {
    tab.addEventListener("click", () => select(tab));
    tab.addEventListener("keydown", (event) => {
      const list = tabs();
      const at = list.indexOf(tab);
      const next = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: list.length - 1 }[event.key];
      if (next === undefined) return;
      event.preventDefault();
      const target = list[(next + list.length) % list.length];
      target.focus();
      select(target);
    });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  setupTabs();
  setupSearch();
  setupPassage();
  setupAsk();
  setupObjects();
  setupOps();
  $("#signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("#token").value.trim();
    $("#token").value = "";
    signIn(token);
  });
  $("#signout").addEventListener("click", signOut);
  signIn(session.token, !session.token);
});
