// The chat page: a conversation streamed from /v1/chat/completions, with the model (or a mounted adapter) picked
// from /v1/models, a system prompt, sampling settings, the reasoning shown apart, and time to first token and
// decode rate under each answer.
import { ApiError, call, getJson, readEvents } from "./api.js";
import { clear, el } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

const state = {
  messages: [], // {role, content, reasoning?, meta?, error?}
  models: [],
  abort: null,
  settings: { model: "", system: "", temperature: "", max_tokens: 512, thinking: true },
};

let root = null;

// The conversation and settings outlive a reload of the tab (sessionStorage: this tab only, gone when it closes).
const SAVED = "lathe.chat";
try {
  const saved = JSON.parse(sessionStorage.getItem(SAVED) || "null");
  if (saved && Array.isArray(saved.messages)) state.messages = saved.messages.filter((m) => m && typeof m.content === "string");
  if (saved && saved.settings && typeof saved.settings === "object") Object.assign(state.settings, saved.settings);
} catch {
  /* a damaged entry starts a new conversation */
}
function save() {
  try {
    sessionStorage.setItem(SAVED, JSON.stringify({ messages: state.messages, settings: state.settings }));
  } catch {
    /* storage full or off: the conversation just does not survive a reload */
  }
}

export async function showChat(container) {
  root = container;
  render();
  try {
    const list = await getJson("/v1/models");
    state.models = list.data || [];
    if (!state.settings.model && state.models.length) state.settings.model = state.models[0].id;
  } catch (e) {
    state.modelsError = e.message;
  }
  render();
}

function modelInfo() {
  return state.models.find((m) => m.id === state.settings.model) || state.models[0] || {};
}

function render() {
  if (!root) return;
  const busy = state.abort !== null;
  const info = modelInfo();
  const base = state.models.find((m) => !m.parent) || {};
  const thinkingCapable = Boolean(info.reasoning ?? base.reasoning);
  const log = el("div", { class: "chat-log", id: "chat-log" });
  if (!state.messages.length)
    log.append(el("p", { class: "hint" }, "Send a message to start. Answers stream from the served model."));
  for (const m of state.messages) log.append(renderMessage(m));

  const input = el("textarea", {
    id: "chat-input",
    rows: 3,
    placeholder: "Message (Enter sends, Shift+Enter adds a line)",
    onkeydown: (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        send(input);
      }
    },
  });
  const settings = el(
    "details",
    { class: "chat-settings" },
    el("summary", {}, "Settings"),
    el(
      "label",
      {},
      "Model ",
      el(
        "select",
        { id: "chat-model", onchange: (ev) => (state.settings.model = ev.target.value) },
        state.models.map((m) =>
          el("option", { value: m.id, selected: m.id === state.settings.model }, m.parent ? `${m.id} (adapter)` : m.id),
        ),
      ),
    ),
    state.modelsError ? el("p", { class: "error" }, `models: ${state.modelsError}`) : null,
    el(
      "label",
      {},
      "System prompt",
      el("textarea", {
        id: "chat-system",
        rows: 2,
        value: state.settings.system,
        oninput: (ev) => (state.settings.system = ev.target.value),
      }),
    ),
    el(
      "div",
      { class: "row" },
      el(
        "label",
        {},
        "Temperature ",
        el("input", {
          id: "chat-temperature",
          type: "number",
          min: 0,
          max: 2,
          step: 0.05,
          placeholder: "model default",
          value: state.settings.temperature,
          oninput: (ev) => (state.settings.temperature = ev.target.value),
        }),
      ),
      el(
        "label",
        {},
        "Max tokens ",
        el("input", {
          id: "chat-max-tokens",
          type: "number",
          min: 1,
          value: state.settings.max_tokens,
          oninput: (ev) => (state.settings.max_tokens = ev.target.value),
        }),
      ),
      thinkingCapable
        ? el(
            "label",
            {},
            el("input", {
              id: "chat-thinking",
              type: "checkbox",
              checked: state.settings.thinking,
              onchange: (ev) => (state.settings.thinking = ev.target.checked),
            }),
            " Thinking",
          )
        : null,
    ),
  );
  const buttons = el(
    "div",
    { class: "row" },
    el("button", { id: "chat-send", disabled: busy, onclick: () => send(input) }, "Send"),
    el("button", { id: "chat-stop", disabled: !busy, onclick: () => state.abort?.abort() }, "Stop"),
    el(
      "button",
      {
        id: "chat-new",
        class: "secondary",
        disabled: busy,
        onclick: () => {
          state.messages = [];
          save();
          render();
        },
      },
      "New chat",
    ),
  );
  clear(root, el("section", { class: "chat" }, settings, log, input, buttons));
  log.scrollTop = log.scrollHeight;
  input.focus();
}

function renderMessage(m) {
  const box = el("div", { class: `msg ${m.role}` }, el("div", { class: "who" }, m.role));
  if (m.reasoning)
    box.append(
      el("details", { class: "reasoning", open: !m.content }, el("summary", {}, "Reasoning"), el("pre", {}, m.reasoning)),
    );
  // Answers render as Markdown; what the user typed stays as typed.
  const markdown = m.role === "assistant" && m.content;
  box.append(el("div", { class: markdown ? "content md" : "content" }, markdown ? renderMarkdown(m.content) : m.content || (m.pending ? "…" : "")));
  if (m.error) box.append(el("p", { class: "error" }, m.error));
  if (m.meta) box.append(el("div", { class: "meta" }, m.meta));
  return box;
}

// Updates the last message's node in place while it streams (a full render per token would reset the input).
function updateLast() {
  const log = root?.querySelector("#chat-log");
  if (!log || !log.lastElementChild) return;
  const last = state.messages[state.messages.length - 1];
  const stick = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  log.lastElementChild.replaceWith(renderMessage(last));
  if (stick) log.scrollTop = log.scrollHeight;
}

function requestBody() {
  const s = state.settings;
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of state.messages) if (!m.error && !m.pending) messages.push({ role: m.role, content: m.content });
  const body = {
    model: s.model || undefined,
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  const maxTokens = parseInt(s.max_tokens, 10);
  if (Number.isFinite(maxTokens) && maxTokens > 0) body.max_tokens = maxTokens;
  if (s.temperature !== "" && Number.isFinite(Number(s.temperature))) body.temperature = Number(s.temperature);
  const info = modelInfo();
  if (info.reasoning || state.models.some((m) => !m.parent && m.reasoning))
    body.chat_template_kwargs = { enable_thinking: Boolean(s.thinking) };
  return body;
}

async function send(input) {
  const text = input.value;
  if (!text.trim() || state.abort) return;
  state.messages.push({ role: "user", content: text });
  const body = requestBody();
  const answer = { role: "assistant", content: "", reasoning: "", pending: true };
  state.messages.push(answer);
  state.abort = new AbortController();
  render();
  const started = performance.now();
  let first = null;
  let usage = null;
  let finish = null;
  try {
    const res = await call("POST", "/v1/chat/completions", body, { signal: state.abort.signal });
    await readEvents(res, ({ data }) => {
      if (data === "[DONE]") return;
      let chunk;
      try {
        chunk = JSON.parse(data);
      } catch {
        return;
      }
      if (chunk.error) throw new ApiError(500, chunk.error.message || "stream error");
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) return;
      const delta = choice.delta || {};
      const piece = (delta.content || "") + "";
      const thought = delta.reasoning_content || "";
      if ((piece || thought) && first === null) first = performance.now();
      answer.content += piece;
      answer.reasoning += thought;
      if (choice.finish_reason) finish = choice.finish_reason;
      updateLast();
    });
  } catch (e) {
    if (e.name === "AbortError") finish = "stopped";
    else answer.error = e.message;
  } finally {
    answer.pending = false;
    const end = performance.now();
    const parts = [];
    if (first !== null) parts.push(`first token ${Math.round(first - started)} ms`);
    if (usage && usage.completion_tokens > 1 && first !== null && end > first)
      parts.push(`${((usage.completion_tokens - 1) / ((end - first) / 1000)).toFixed(1)} tok/s`);
    if (usage) parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} tokens`);
    if (finish) parts.push(finish);
    answer.meta = parts.join(" · ");
    if (!answer.content && !answer.error && !answer.reasoning) answer.content = "";
    state.abort = null;
    save();
    render();
  }
}
