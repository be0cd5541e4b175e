// The passage panel: a stored chunk in context (read_chunk with its neighbours), opened from a search
// hit or an answer's citation.

import { action } from "./api.js";
import { $, clear, el, showError } from "./dom.js";

function where(chunk) {
  const parts = [`${chunk.section_tipo} ${chunk.section_id}`];
  if (chunk.heading_path && chunk.heading_path.length) parts.push(chunk.heading_path.join(" › "));
  if (chunk.page !== null && chunk.page !== undefined) parts.push(`page ${chunk.page}`);
  if (chunk.tc_in) parts.push(`${chunk.tc_in}${chunk.tc_out ? ` – ${chunk.tc_out}` : ""}`);
  if (chunk.lang) parts.push(chunk.lang);
  return parts.join(" · ");
}

export async function openPassage(chunkId) {
  const panel = $("#passage");
  panel.hidden = false;
  showError("passage", null);
  clear($("#passage-title"), "Passage");
  clear($("#passage-where"), "Loading…");
  clear($("#passage-body"));
  try {
    const { data } = await action("read_chunk", { chunk_id: chunkId, before: 2, after: 2 });
    const chunk = data.chunk;
    clear($("#passage-title"), chunk.title || `${chunk.section_tipo} ${chunk.section_id}`);
    clear($("#passage-where"), where(chunk));
    const paragraph = (c, cls) => el("p", { class: cls, "data-chunk-id": c.chunk_id }, c.text);
    clear(
      $("#passage-body"),
      data.before.map((c) => paragraph(c, "context")),
      paragraph(chunk, "cited"),
      data.after.map((c) => paragraph(c, "context")),
    );
  } catch (failure) {
    clear($("#passage-where"));
    showError("passage", failure);
  }
  panel.focus();
}

export function setupPassage() {
  $("#passage-close").addEventListener("click", () => {
    $("#passage").hidden = true;
  });
}
