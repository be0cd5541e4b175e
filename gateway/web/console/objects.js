// Objects: a thumbnail grid from search_by_text_image; from any object, similar_objects and
// characterize_object. Thumbnails are fetched with the token.

import { action, thumbnail } from "./api.js";
import { $, clear, el, showError } from "./dom.js";

let seed = null;

function tile(object, onOpen) {
  const img = el("img", { alt: `${object.title || object.section_tipo} ${object.section_id} (${object.view || "image"})` });
  thumbnail(object.thumb_url).then(
    (url) => {
      if (url) img.src = url;
      else img.replaceWith(el("span", { class: "no-thumb" }, "no thumbnail"));
    },
    (failure) => img.replaceWith(el("span", { class: "no-thumb" }, failure.labelKey)),
  );
  const facts = [`${object.section_tipo} ${object.section_id}`];
  if (object.view) facts.push(object.view);
  if (object.similarity !== null && object.similarity !== undefined) facts.push(`sim ${object.similarity.toFixed(3)}`);
  if (object.weight !== undefined) facts.push(`weight ${object.weight.toFixed(3)}`);
  const caption = el("span", { class: "tile-caption" }, object.title ? el("strong", {}, object.title) : null, facts.join(" · "));
  const body = [img, caption];
  return el(
    "li",
    { class: "tile" },
    onOpen ? el("button", { type: "button", onclick: () => onOpen(object) }, body) : el("div", {}, body),
  );
}

function proposal(name, p) {
  const head = `${name}: `;
  if (p.kind === "date") {
    const value = p.earliest === null ? "no proposal" : `${p.earliest} – ${p.latest} (centre ${p.central})`;
    return el("li", {}, el("strong", {}, head), value, ` · confidence ${p.confidence.toFixed(2)}`,
      el("ul", { class: "grid small", "aria-label": `Evidence for ${name}` }, p.evidence.map((o) => tile(o, openObject))));
  }
  return el("li", {}, el("strong", {}, head), p.value === null ? "no proposal" : String(p.value),
    ` · confidence ${p.confidence.toFixed(2)}`,
    el("ul", { class: "grid small", "aria-label": `Evidence for ${name}` }, p.evidence.map((o) => tile(o, openObject))));
}

async function similar(event) {
  if (event) event.preventDefault();
  showError("detail", null);
  const options = {
    section_tipo: seed.section_tipo,
    section_id: seed.section_id,
    similarity_mode: $("#similar-mode").value,
    near_duplicate: $("#similar-dup").checked,
  };
  if ($("#similar-view").value) options.view = $("#similar-view").value;
  clear($("#similar-grid"));
  clear($("#characterization"), "Loading…");
  try {
    const [found, character] = await Promise.all([
      action("similar_objects", options),
      action("characterize_object", { section_tipo: seed.section_tipo, section_id: seed.section_id, similarity_mode: options.similarity_mode }),
    ]);
    clear($("#similar-grid"), found.data.length ? found.data.map((o) => tile(o, openObject)) : el("li", {}, "No similar object you may see."));
    const proposals = Object.entries(character.data.proposals || {});
    clear(
      $("#characterization"),
      proposals.length
        ? el("ul", { class: "proposals" }, proposals.map(([role, p]) => proposal(role, p)))
        : el("p", {}, "No proposal: no readable neighbour carries these roles."),
    );
  } catch (failure) {
    clear($("#characterization"));
    showError("detail", failure);
  }
}

function openObject(object) {
  seed = object;
  $("#object-detail").hidden = false;
  clear($("#object-title"), object.title || `${object.section_tipo} ${object.section_id}`);
  clear($("#object-seed"), tile(object, null));
  similar(null);
  $("#object-title").focus();
}

async function find(event) {
  event.preventDefault();
  showError("objects", null);
  clear($("#objects-status"), "Searching…");
  try {
    const { data } = await action("search_by_text_image", {
      query: $("#objects-query").value,
      section_tipo: $("#objects-section").value.trim(),
      limit: 24,
    });
    clear($("#objects-status"), `${data.length} objects`);
    clear($("#objects-grid"), data.map((o) => tile(o, openObject)));
  } catch (failure) {
    clear($("#objects-status"));
    clear($("#objects-grid"));
    showError("objects", failure);
  }
}

export function setupObjects() {
  $("#objects-form").addEventListener("submit", find);
  $("#similar-form").addEventListener("submit", similar);
}
