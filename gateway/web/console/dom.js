// DOM helpers. Everything from the API is set as text (textContent, text nodes), never as HTML, so a
// title like <img src=x onerror=alert(1)> shows those characters and runs nothing.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  node.append(...children.flat().filter((c) => c !== null && c !== undefined).map(asNode));
  return node;
}

function asNode(child) {
  return child instanceof Node ? child : document.createTextNode(String(child));
}

export function $(selector) {
  return document.querySelector(selector);
}

export function clear(node, ...children) {
  node.replaceChildren(...children.flat().map(asNode));
}

// Words too common to be worth marking (what the lexical leg's ranking gives little weight to anyway).
const COMMON = new Set(
  "the and for with from that this was were had have has you our but not are los las del por con una que les des une und der die das".split(" "),
);

// `text` with the query's words wrapped in <mark> (case- and accent-insensitive), as text nodes.
export function marked(text, query) {
  const words = fold(query).split(/[^\p{L}\p{N}]+/u);
  const terms = [...new Set(words.filter((t) => t.length > 2 && !COMMON.has(t)))];
  if (!terms.length) return [text];
  const folded = fold(text);
  const out = [];
  let at = 0;
  const alternatives = terms.map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|");
  // Whole words only: "came" marks "came", not the middle of "became".
  const pattern = new RegExp(`(?<![\\p{L}\\p{N}])(?:${alternatives})(?![\\p{L}\\p{N}])`, "gu");
  for (const match of folded.matchAll(pattern)) {
    out.push(text.slice(at, match.index), el("mark", {}, text.slice(match.index, match.index + match[0].length)));
    at = match.index + match[0].length;
  }
  out.push(text.slice(at));
  return out;
}

// Lower case without accents, one UTF-16 unit for one, so offsets found in the folded text hold in
// the original (a unit whose folding would change the length is kept as it is).
function fold(text) {
  let out = "";
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    const folded = (c.normalize("NFD")[0] || c).toLowerCase();
    out += folded.length === 1 ? folded : c;
  }
  return out;
}

// A failure in words: the error's label_key and message, in the panel's alert box.
export function showError(name, failure) {
  const box = document.querySelector(`[data-error="${name}"]`);
  if (!failure) {
    box.hidden = true;
    box.replaceChildren();
    return;
  }
  const label = failure.labelKey || "console.error";
  box.replaceChildren(el("strong", { class: "label-key" }, label), " ", el("span", {}, failure.message || String(failure)));
  box.hidden = false;
}
