// Ask: a grounded answer streamed as it is generated, its citations [n] opening the cited passage.

import { askStream } from "./api.js";
import { $, clear, el, showError } from "./dom.js";
import { openPassage } from "./passage.js";
import { tipos } from "./search.js";

const OUTCOMES = {
  ok: "Answered from the passages below.",
  no_grounded_context: "No passage you may read answers this question, so no answer was generated.",
  external_generation_restricted:
    "Withheld: the passages that would answer come from sections that may not be sent to the external " +
    "model, so no answer was generated.",
};

// The answer's text with each [n] (or [n, m]) as links to the cited passages.
function withCitations(text, citations) {
  const byNumber = new Map(citations.map((c) => [c.n, c]));
  const out = [];
  let at = 0;
  for (const match of text.matchAll(/\[(\d+(?:\s*,\s*\d+)*)\]/g)) {
    out.push(text.slice(at, match.index), "[");
    match[1].split(",").forEach((raw, i) => {
      const cited = byNumber.get(Number(raw.trim()));
      if (i) out.push(", ");
      out.push(
        cited
          ? el("a", { href: "#passage", class: "cite", "data-n": cited.n, "data-chunk-id": cited.chunkId, onclick: (e) => {
              e.preventDefault();
              openPassage(cited.chunkId);
            } }, String(cited.n))
          : raw.trim(),
      );
    });
    out.push("]");
    at = match.index + match[0].length;
  }
  out.push(text.slice(at));
  return out;
}

function source(p) {
  return el(
    "li",
    { value: p.n },
    el("button", { type: "button", class: "source", onclick: () => openPassage(p.chunk_id) },
      p.title || `${p.section_tipo} ${p.section_id}`),
    " ",
    el("span", { class: "meta" }, `${p.section_tipo} ${p.section_id}`),
  );
}

async function ask(event) {
  event.preventDefault();
  showError("ask", null);
  const options = { query: $("#ask-query").value };
  const sections = tipos($("#ask-section").value);
  if (sections) options.section_tipo = sections;
  const started = Date.now();
  const tick = () => clear($("#ask-status"), `Retrieving and generating… ${Math.round((Date.now() - started) / 1000)} s`);
  tick();
  const timer = setInterval(tick, 1000);
  $("#ask-answer").hidden = false;
  clear($("#ask-outcome"));
  clear($("#ask-text"));
  clear($("#ask-provider"));
  clear($("#ask-sources"));
  let streamed = "";
  try {
    const done = await askStream(options, (text) => {
      streamed += text;
      clear($("#ask-text"), streamed);
    });
    const data = done.data;
    clear($("#ask-outcome"), OUTCOMES[done.msg] || done.msg);
    clear($("#ask-text"), withCitations(data.answer, data.citations));
    clear(
      $("#ask-provider"),
      data.used_provider ? `Provider ${data.used_provider}, model ${data.model || "none"}` : "No model was called",
    );
    clear($("#ask-sources"), data.provenance.filter((p) => p.n !== undefined).map(source));
    clear($("#ask-status"), `Done in ${Math.round((Date.now() - started) / 100) / 10} s`);
  } catch (failure) {
    clear($("#ask-status"));
    $("#ask-answer").hidden = true;
    showError("ask", failure);
  } finally {
    clearInterval(timer);
  }
}

export function setupAsk() {
  $("#ask-form").addEventListener("submit", ask);
}
