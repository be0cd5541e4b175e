// The gateway's public API as the console calls it: the person's token on every request, never in a
// URL; every failure surfaces as an ApiFailure carrying the envelope's label_key and message.

const TOKEN_KEY = "mnemo.token";

export class ApiFailure extends Error {
  constructor(error, status) {
    super(error.message || "The request failed");
    this.labelKey = error.label_key || error.code || "error.unknown";
    this.code = error.code || "";
    this.status = status;
  }
}

// sessionStorage: the token survives a reload of this tab only, and no other tab or site sees it.
export const session = {
  get token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  },
  set token(value) {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  },
};

function headers(extra = {}) {
  const out = { ...extra };
  if (session.token) out.Authorization = `Bearer ${session.token}`;
  return out;
}

async function jsonBody(response) {
  try {
    return await response.json();
  } catch {
    throw new ApiFailure(
      { label_key: "console.bad_response", message: `HTTP ${response.status} without a JSON envelope` },
      response.status,
    );
  }
}

async function envelope(response) {
  const body = await jsonBody(response);
  if (!body.ok) throw new ApiFailure(body.error || {}, response.status);
  return body;
}

async function send(path, init) {
  try {
    return await fetch(path, { ...init, credentials: "omit", cache: "no-store" });
  } catch (exc) {
    throw new ApiFailure({ label_key: "console.network", message: `The gateway did not answer: ${exc}` }, 0);
  }
}

// One dd_rag_api action; resolves to the whole success envelope ({msg, data, ...}).
export async function action(name, options) {
  const response = await send("/api/v1/json", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({ dd_api: "dd_rag_api", action: name, options }),
  });
  return envelope(response);
}

export async function get(path) {
  return (await envelope(await send(path, { headers: headers() }))).data;
}

// A route that answers OpenAI's shape (GET /v1/models): its body as it is; a failure is still the
// error envelope.
export async function getOpenAI(path) {
  const response = await send(path, { headers: headers() });
  const body = await jsonBody(response);
  if (!response.ok) throw new ApiFailure(body.error || {}, response.status);
  return body;
}

export async function post(path, body) {
  const response = await send(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
  });
  return (await envelope(response)).data;
}

// A thumbnail fetched with the token, as an object URL for an <img> (an <img src> cannot carry it).
export async function thumbnail(path) {
  if (typeof path !== "string" || !path.startsWith("/v1/thumbnails/")) return null;
  const response = await send(path, { headers: headers() });
  if (!response.ok) await envelope(response);
  return URL.createObjectURL(await response.blob());
}

// ask with stream: true. Calls onDelta(text) per generated piece; resolves to the final envelope.
export async function askStream(options, onDelta) {
  const response = await send("/api/v1/json", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify({ dd_api: "dd_rag_api", action: "ask", options: { ...options, stream: true } }),
  });
  if (!(response.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
    return envelope(response); // refused before generation: an ordinary JSON envelope
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = parseEvent(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
      if (event.name === "delta") onDelta(event.data.text);
      else if (event.name === "error") throw new ApiFailure(event.data.error || {}, response.status);
      else if (event.name === "done") {
        if (!event.data.ok) throw new ApiFailure(event.data.error || {}, response.status);
        return event.data;
      }
    }
  }
  throw new ApiFailure({ label_key: "console.stream_cut", message: "The answer stream ended early" }, 0);
}

function parseEvent(block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) name = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  return { name, data: JSON.parse(data.join("\n") || "{}") };
}
