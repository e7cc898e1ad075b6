// Talking to the server: the API key (kept in this browser's localStorage, sent as a bearer token), JSON calls
// whose errors carry the server's own message, and a server-sent-events reader over fetch (EventSource cannot
// send the key).

const KEY_STORE = "lathe.apiKey";

export function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
}

// Listeners told when the server asks for a key (401) so the page can offer to set one.
const authListeners = new Set();
export function onAuthNeeded(fn) {
  authListeners.add(fn);
}

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

function headers(extra = {}) {
  const h = { ...extra };
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// The message a lathe error body holds: OpenAI {error:{message}}, Anthropic {error:{message}} or jobs {error}.
function errorMessage(status, body, text) {
  if (body && typeof body === "object") {
    if (body.error && typeof body.error === "object" && body.error.message) return body.error.message;
    if (typeof body.error === "string") return body.error;
    if (typeof body.message === "string") return body.message;
  }
  return text ? `${status}: ${text.slice(0, 300)}` : `HTTP ${status}`;
}

async function failure(res) {
  const text = await res.text().catch(() => "");
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    body = null;
  }
  if (res.status === 401) for (const fn of authListeners) fn();
  return new ApiError(res.status, errorMessage(res.status, body, text), body);
}

// fetch, with the key; throws ApiError for a non-2xx answer.
export async function call(method, path, body, { signal, accept, headers: extra } = {}) {
  const init = { method, headers: headers({ ...(accept ? { Accept: accept } : {}), ...(extra || {}) }), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, `the server did not answer (${e.message})`);
  }
  if (!res.ok) throw await failure(res);
  return res;
}

export async function getJson(path, opts) {
  return (await call("GET", path, undefined, opts)).json();
}

export async function postJson(path, body, opts) {
  return (await call("POST", path, body, opts)).json();
}

export async function getText(path, opts) {
  return (await call("GET", path, undefined, opts)).text();
}

// Reads a text/event-stream response; calls onEvent({id, event, data}) per event. Resolves at the stream's end.
// When onEvent throws, the stream is cancelled (its connection closed) before the error goes on: a reader left
// locked would keep the response, and one of the browser's few connections to this server, open.
export async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  try {
    await readFrames(reader, onEvent);
  } catch (e) {
    reader.cancel().catch(() => {});
    throw e;
  }
}

async function readFrames(reader, onEvent) {
  const decoder = new TextDecoder();
  let buffer = "";
  let frame = { id: null, event: "message", data: [] };
  const dispatch = () => {
    if (frame.data.length) onEvent({ id: frame.id, event: frame.event, data: frame.data.join("\n") });
    frame = { id: null, event: "message", data: [] };
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buffer.search(/\r\n|\n|\r/)) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + (buffer.startsWith("\r\n", nl) ? 2 : 1));
      if (line === "") {
        dispatch();
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") frame.data.push(value);
      else if (field === "event") frame.event = value;
      else if (field === "id") frame.id = value;
    }
  }
  dispatch();
}
