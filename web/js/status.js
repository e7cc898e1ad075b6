// The status page: the served model and adapters, the prompt cache's tiers and a few live gauges from /metrics,
// refreshed every few seconds while shown.
import { getJson, getText } from "./api.js";
import { clear, el, fmtBytes, fmtNumber } from "./dom.js";

let view = 0;

export function leaveStatus() {
  view++;
}

// Sums a Prometheus text exposition's samples by metric name (labels added together).
export function parseMetrics(text) {
  const sums = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const v = Number(m[3]);
    if (Number.isFinite(v)) sums.set(m[1], (sums.get(m[1]) || 0) + v);
  }
  return sums;
}

function table(rows) {
  return el(
    "table",
    { class: "kv" },
    el(
      "tbody",
      {},
      rows.filter(Boolean).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))),
    ),
  );
}

async function settle(promise) {
  try {
    return { value: await promise };
  } catch (e) {
    return { error: e.message };
  }
}

export async function showStatus(container) {
  const token = ++view;
  const body = el("div", { id: "status-view" }, el("p", { class: "hint" }, "loading…"));
  clear(container, el("h2", {}, "Status"), body);
  while (token === view) {
    const [health, models, adapters, cache, metrics] = await Promise.all([
      settle(getJson("/health")),
      settle(getJson("/v1/models")),
      settle(getJson("/v1/adapters")),
      settle(getJson("/v1/cache")),
      settle(getText("/metrics")),
    ]);
    if (token !== view) return;
    const parts = [];
    parts.push(
      el("h3", {}, "Server"),
      health.error
        ? el("p", { class: "error", id: "status-health" }, health.error)
        : el("p", { id: "status-health" }, el("span", { class: "badge done" }, health.value.status)),
    );
    if (models.value) {
      const base = models.value.data.filter((m) => !m.parent);
      const first = base[0] || {};
      parts.push(
        el("h3", {}, "Model"),
        table([
          ["Id", el("code", { id: "status-model" }, first.id || "–")],
          ["Also answers to", base.slice(1).map((m) => m.id).join(", ") || "–"],
          ["Context window", String(first.context_window ?? "–")],
          ["Reasoning", first.reasoning ? "yes" : "no"],
        ]),
      );
    } else parts.push(el("p", { class: "error" }, `models: ${models.error}`));
    if (adapters.value) {
      const list = adapters.value.data || [];
      parts.push(
        el("h3", {}, "Adapters"),
        list.length
          ? el(
              "table",
              { class: "jobs" },
              el("thead", {}, el("tr", {}, ["Id", "Rank", "Scale", "Size", "Default"].map((h) => el("th", {}, h)))),
              el(
                "tbody",
                {},
                list.map((a) =>
                  el("tr", {}, el("td", {}, a.id), el("td", {}, String(a.rank)), el("td", {}, fmtNumber(a.scale)), el("td", {}, fmtBytes(a.bytes)), el("td", {}, a.default ? "yes" : "")),
                ),
              ),
            )
          : el("p", { class: "hint" }, "None mounted."),
      );
    }
    if (cache.value) {
      const { ram, ssd } = cache.value;
      parts.push(
        el("h3", {}, "Prompt cache"),
        table([
          ["RAM entries", String(ram.entries)],
          ["RAM bytes", fmtBytes(ram.bytes)],
          ["RAM hits / misses", `${ram.hits} / ${ram.misses}`],
          ["Reused tokens", String(ram.reused_tokens)],
          ssd ? ["SSD tier", el("code", {}, ssd.dir)] : ["SSD tier", "off (--ssd-cache DIR)"],
          ssd && ["SSD entries / bytes", `${ssd.entries} / ${fmtBytes(ssd.bytes)}`],
          ssd && ["SSD hits / misses", `${ssd.hits} / ${ssd.misses}`],
        ]),
      );
    }
    if (metrics.value) {
      const m = parseMetrics(metrics.value);
      const g = (name) => (m.has(name) ? fmtNumber(m.get(name)) : "–");
      const used = m.get("lathe_kv_cache_bytes_used");
      const budget = m.get("lathe_kv_cache_bytes_budget");
      parts.push(
        el("h3", {}, "Load"),
        table([
          ["Requests", g("lathe_requests_total")],
          ["Prompt tokens", g("lathe_prompt_tokens_total")],
          ["Generated tokens", el("span", { id: "status-generated" }, g("lathe_generation_tokens_total"))],
          ["Running / queued", `${g("lathe_scheduler_running_rows")} / ${g("lathe_queue_depth")}`],
          ["KV cache", used !== undefined && budget ? `${fmtBytes(used)} of ${fmtBytes(budget)}` : "–"],
          ["Preemptions", g("lathe_preemptions_total")],
        ]),
      );
    }
    clear(body, parts);
    await new Promise((r) => setTimeout(r, 5000));
  }
}
