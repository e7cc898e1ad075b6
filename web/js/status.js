// The status page: the served model and adapters, the prompt cache's tiers and a few live gauges from /metrics,
// refreshed every few seconds while shown.
import { call, getJson, getText, postJson } from "./api.js";
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
    const [health, models, adapters, availableList, cache, metrics] = await Promise.all([
      settle(getJson("/health")),
      settle(getJson("/v1/models")),
      settle(getJson("/v1/adapters")),
      settle(getJson("/v1/adapters/available")),
      settle(getJson("/v1/cache")),
      settle(getText("/metrics")),
    ]);
    if (token !== view) return;
    const available = availableList.value ? availableList.value.data || [] : [];
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
    if (adapters.value) parts.push(el("h3", {}, "Adapters"), adapterTables(adapters.value.data || [], available, container));
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

// Mounted adapters (with Unmount) and those the --adapter-dir stores hold (with Mount); a click redraws the page.
function adapterTables(mounted, available, container) {
  const act = async (button, fn) => {
    button.disabled = true;
    try {
      await fn();
      showStatus(container);
    } catch (e) {
      button.disabled = false;
      button.after(el("span", { class: "error" }, ` ${e.message}`));
    }
  };
  const rows = mounted.map((a) =>
    el(
      "tr",
      { dataset: { adapter: a.id } },
      el("td", {}, a.id),
      el("td", {}, String(a.rank)),
      el("td", {}, fmtNumber(a.scale)),
      el("td", {}, fmtBytes(a.bytes)),
      el("td", {}, a.default ? "default" : ""),
      el(
        "td",
        {},
        el(
          "button",
          {
            class: "secondary",
            onclick: (ev) => act(ev.target, () => call("DELETE", `/v1/adapters/${encodeURIComponent(a.id)}`)),
          },
          "Unmount",
        ),
      ),
    ),
  );
  for (const a of available.filter((x) => !x.mounted))
    rows.push(
      el(
        "tr",
        { dataset: { available: a.id } },
        el("td", {}, a.id),
        el("td", {}, String(a.rank ?? "")),
        el("td", {}, fmtNumber(a.scale)),
        el("td", {}, fmtBytes(a.bytes)),
        el("td", { class: a.fits ? "" : "error" }, a.fits ? "not mounted" : a.reason || "does not fit"),
        el(
          "td",
          {},
          el(
            "button",
            { disabled: !a.fits, onclick: (ev) => act(ev.target, () => postJson("/v1/adapters", { path: a.path })) },
            "Mount",
          ),
        ),
      ),
    );
  if (!rows.length)
    return el("p", { class: "hint" }, "None mounted, and no --adapter-dir store holds one.");
  return el(
    "table",
    { class: "jobs", id: "adapters" },
    el("thead", {}, el("tr", {}, ["Id", "Rank", "Scale", "Size", "", ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows),
  );
}
