// The jobs pages: the list (polled while shown), one job followed live over its event stream (progress, stage,
// log, loss curves), and the forms that start jobs (job_forms.js).
import { ApiError, call, getJson, postJson, readEvents } from "./api.js";
import { clear, el, fmtNumber, svg } from "./dom.js";
import { showJobForm } from "./job_forms.js";

// The shown page's AbortController, aborted on leaving it: its reads and event stream stop, and its polls and
// redraws see signal.aborted. Made before the page's first await, so a page whose first read answers after the
// next page opened cannot take the next page's place.
let shown = null;

export function showJobs(container, parts, query) {
  leaveJobs();
  shown = new AbortController();
  const { signal } = shown;
  if (parts[0] === "new") return showJobForm(container, parts[1] || "quantize", query);
  if (parts[0]) return showJob(container, parts[0], signal);
  return showList(container, query, signal);
}

export function leaveJobs() {
  shown?.abort();
  shown = null;
}

function statusBadge(status) {
  return el("span", { class: `badge ${status}` }, status);
}

function progressBar(p) {
  const pct = Math.max(0, Math.min(1, Number(p) || 0)) * 100;
  const fill = el("div");
  fill.style.width = `${pct.toFixed(1)}%`; // through the CSSOM: the page's CSP refuses style attributes
  return el(
    "div",
    { class: "progress", role: "progressbar", "aria-valuenow": Math.round(pct), "aria-valuemin": 0, "aria-valuemax": 100 },
    fill,
  );
}

const KINDS = ["quantize", "finetune", "dataset", "fuse"];
const STATUSES = ["queued", "running", "done", "failed", "cancelled", "zombie"];

// A filter of the list: its choice lives in the page's address (#/jobs?kind=…&status=…), so a reload keeps it.
function filterSelect(id, label, values, chosen, query, key) {
  const select = el(
    "select",
    {
      id,
      "aria-label": label,
      onchange: () => {
        const q = new URLSearchParams({ ...query, [key]: select.value });
        if (!select.value) q.delete(key);
        const text = q.toString();
        location.hash = text ? `#/jobs?${text}` : "#/jobs";
      },
    },
    el("option", { value: "" }, `any ${label}`),
    values.map((v) => el("option", { value: v, selected: v === chosen ? "" : null }, v)),
  );
  return select;
}

async function showList(container, query, signal) {
  const kind = KINDS.includes(query.kind) ? query.kind : "";
  const status = STATUSES.includes(query.status) ? query.status : "";
  const table = el("tbody", { id: "jobs-rows" });
  const note = el("p", { class: "hint", id: "jobs-note" }, "loading…");
  clear(
    container,
    el(
      "div",
      { class: "row" },
      el("h2", {}, "Jobs"),
      el("a", { class: "button", href: "#/jobs/new/quantize", id: "new-quantize" }, "Quantize"),
      el("a", { class: "button", href: "#/jobs/new/finetune", id: "new-finetune" }, "Fine-tune"),
      el("a", { class: "button", href: "#/jobs/new/dataset", id: "new-dataset" }, "Build dataset"),
      el("a", { class: "button", href: "#/jobs/new/fuse", id: "new-fuse" }, "Fuse adapter"),
    ),
    el(
      "div",
      { class: "row" },
      filterSelect("jobs-kind", "kind", KINDS, kind, query, "kind"),
      filterSelect("jobs-status", "status", STATUSES, status, query, "status"),
    ),
    el(
      "table",
      { class: "jobs" },
      el("thead", {}, el("tr", {}, ["Job", "Kind", "Status", "Progress", "Queued (UTC)", "Message"].map((h) => el("th", {}, h)))),
      table,
    ),
    note,
  );
  const params = new URLSearchParams({ limit: "100" });
  if (kind) params.set("kind", kind);
  if (status) params.set("status", status);
  while (!signal.aborted) {
    try {
      const { jobs } = await getJson(`/api/jobs?${params}`, { signal });
      if (signal.aborted) return;
      clear(
        table,
        jobs.map((j) =>
          el(
            "tr",
            { dataset: { id: j.id } },
            el("td", {}, el("a", { href: `#/jobs/${j.id}` }, j.id)),
            el("td", {}, j.kind),
            el("td", {}, statusBadge(j.status)),
            el("td", {}, progressBar(j.progress)),
            el("td", {}, j.started_at),
            el("td", { class: "message" }, j.error || j.message || ""),
          ),
        ),
      );
      note.textContent = jobs.length ? "" : kind || status ? "No jobs match." : "No jobs yet.";
      note.className = "hint";
    } catch (e) {
      if (signal.aborted) return;
      note.textContent = e.message;
      note.className = "error";
    }
    await new Promise((r) => setTimeout(r, 2000));
  }
}

// What one job's events add up to.
function jobModel(job) {
  return { job, stage: "", stageMessage: "", progress: job.progress || 0, log: [], train: [], val: [], ended: null };
}

function applyEvent(m, e) {
  switch (e.type) {
    case "started":
      m.job.status = "running";
      break;
    case "log":
      m.log.push(e.line);
      if (m.log.length > 2000) m.log.splice(0, m.log.length - 2000);
      break;
    case "stage":
      m.stage = e.stage || m.stage;
      m.stageMessage = e.message || "";
      if (typeof e.progress === "number") m.progress = e.progress;
      break;
    case "metric":
      if (typeof e.loss === "number" && typeof e.step === "number") (e.kind === "val" ? m.val : m.train).push([e.step, e.loss]);
      if (typeof e.progress === "number") m.progress = e.progress;
      if (e.kind !== "val") m.lastMetric = e;
      break;
    case "done":
      m.ended = e;
      m.job.status = "done";
      m.progress = 1;
      if (e.output_dir) m.job.output_path = e.output_dir;
      break;
    case "failed":
      m.ended = e;
      m.job.status = e.status || "failed";
      m.job.error = e.error;
      break;
  }
}

async function showJob(container, id, signal) {
  // The page left goes at once: its badges and buttons must not stand under this job's address while it loads.
  clear(container, el("p", { class: "hint" }, "loading…"));
  let m;
  try {
    m = jobModel((await getJson(`/api/jobs/${encodeURIComponent(id)}`, { signal })).job);
  } catch (e) {
    if (!signal.aborted) clear(container, el("p", { class: "error" }, e.message), el("a", { href: "#/jobs" }, "All jobs"));
    return;
  }
  if (signal.aborted) return; // another page opened while this one's job was read
  const body = el("div", { id: "job-view" });
  clear(container, el("p", {}, el("a", { href: "#/jobs" }, "← All jobs")), body);
  let scheduled = false;
  const draw = () => {
    scheduled = false;
    if (!signal.aborted) renderJob(body, m);
  };
  const redraw = () => {
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(draw);
    }
  };
  draw();
  // Follow the events; on a dropped stream, resume after the last event seen (Last-Event-ID).
  let lastId = null;
  for (let attempt = 0; !signal.aborted && attempt < 50; attempt++) {
    let ended = false;
    try {
      const init = lastId === null ? {} : { headers: { "Last-Event-ID": lastId } };
      const res = await streamEvents(id, init, signal);
      await readEvents(res, (ev) => {
        if (signal.aborted) throw new DOMException("left", "AbortError");
        if (ev.event === "end") {
          ended = true;
          return;
        }
        if (ev.id !== null) lastId = ev.id;
        try {
          applyEvent(m, JSON.parse(ev.data));
        } catch {
          /* a line that is not JSON is skipped */
        }
        redraw();
      });
    } catch (e) {
      if (e.name === "AbortError" || signal.aborted) return;
      m.streamError = e.message;
      redraw();
      if (e instanceof ApiError && e.status >= 400 && e.status < 500 && e.status !== 429) return;
    }
    if (ended) break;
    await new Promise((r) => setTimeout(r, 1500));
  }
  // The row has the final word (status, output, error) once the stream ends.
  try {
    const { job } = await getJson(`/api/jobs/${encodeURIComponent(id)}`, { signal });
    m.job = { ...m.job, ...job };
    m.progress = job.status === "done" ? 1 : m.progress;
    m.streamError = null;
  } catch {
    /* keep what the events said */
  }
  redraw();
}

function streamEvents(id, init, signal) {
  return call("GET", `/api/jobs/${encodeURIComponent(id)}/events`, undefined, {
    signal,
    accept: "text/event-stream",
    headers: init.headers,
  });
}

// A job page's action button: disabled while its request runs; a failure is shown on the page, which is redrawn
// with the button back.
function actionButton(node, m, attrs, label, run, errorPrefix = "") {
  const onclick = async (ev) => {
    ev.target.disabled = true;
    m.actionError = null;
    let failed = null;
    try {
      await run();
    } catch (e) {
      failed = e;
    }
    ev.target.disabled = false; // the page keeps this button across redraws (renderJob)
    if (failed) {
      m.actionError = errorPrefix + failed.message;
      renderJob(node, m);
    }
  };
  return el("button", { ...attrs, onclick }, label);
}

function renderJob(node, m) {
  const j = m.job;
  const running = j.status === "queued" || j.status === "running";
  const actions = el("div", { class: "row" });
  if (running)
    actions.append(
      // On success the job's events redraw the page (cancelled, or done if it finished first).
      actionButton(node, m, { id: "job-cancel" }, "Cancel", () =>
        postJson(`/api/jobs/${encodeURIComponent(j.id)}/cancel`, {}),
      ),
    );
  if (j.status === "running" && j.kind === "finetune")
    actions.append(
      // The trainer finishes its current step and writes the adapter of the steps taken; the job ends done.
      actionButton(node, m, { id: "job-stop", class: "secondary" }, "Stop and save", () =>
        postJson(`/api/jobs/${encodeURIComponent(j.id)}/stop`, {}),
      ),
    );
  const cutShort = ["cancelled", "failed", "zombie"].includes(j.status) || (j.status === "done" && m.ended?.summary?.stopped_early);
  if (j.kind === "finetune" && cutShort)
    actions.append(
      // The same config again: the trainer picks up its last checkpoint (a stop writes one; save_every others).
      actionButton(node, m, { id: "job-rerun", title: "the same config again: it resumes from its last checkpoint" }, "Run again", async () => {
        const config = typeof j.config === "string" ? JSON.parse(j.config) : j.config;
        const { job } = await postJson("/api/jobs", { kind: j.kind, config });
        location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
      }),
    );
  if (!running)
    actions.append(
      actionButton(node, m, { id: "job-delete", class: "secondary" }, "Delete", async () => {
        await call("DELETE", `/api/jobs/${encodeURIComponent(j.id)}`);
        location.hash = "#/jobs";
      }),
    );
  if (j.status === "done" && j.kind === "dataset" && j.output_path)
    actions.append(
      el("a", { class: "button", id: "job-finetune-on", href: `#/jobs/new/finetune?data_dir=${encodeURIComponent(j.output_path)}` }, "Fine-tune on it"),
    );
  if (j.status === "done" && j.kind === "finetune" && j.output_path)
    actions.append(
      actionButton(
        node,
        m,
        { id: "job-mount" },
        "Mount adapter",
        async () => {
          const a = await postJson("/v1/adapters", { path: j.output_path });
          m.actionNote = `mounted as '${a.id || (a.data && a.data.id) || "adapter"}': pick it in Chat`;
          renderJob(node, m);
        },
        "mount: ",
      ),
    );
  if (j.status === "done" && j.kind === "finetune" && j.output_path)
    actions.append(
      // A new checkpoint with the adapter folded into the base's weights (re-quantized like the base).
      actionButton(node, m, { id: "job-fuse", class: "secondary", title: "write the base with this adapter folded into its weights" }, "Fuse into base", async () => {
        const config = typeof j.config === "string" ? JSON.parse(j.config) : j.config;
        const fuse = { model: config.model_dir, adapter: j.output_path, out: `${j.output_path.replace(/\/+$/, "")}-fused` };
        const { job } = await postJson("/api/jobs", { kind: "fuse", config: fuse });
        location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
      }, "fuse: "),
    );
  if (j.status === "done" && j.kind === "quantize" && j.output_path)
    actions.append(
      el("a", { class: "button", href: `#/jobs/new/finetune?model_dir=${encodeURIComponent(j.output_path)}` }, "Fine-tune it"),
    );
  // A running job redraws on every event. The page is a fixed row of parts, each refilled in place, and the
  // buttons' part is refilled only when the buttons change: a button must stay in the document across redraws,
  // since one taken out between a click's mouse-down and mouse-up loses the click even when the same element is
  // put back (what CI's loaded runs of the web UI test kept hitting), and one whose request is in flight stays
  // disabled.
  const actionsKey = `${j.status}|${[...actions.children].map((b) => b.id || b.textContent).join(",")}`;
  const config = typeof j.config === "string" ? j.config : JSON.stringify(j.config, null, 2);
  const facts = el(
    "dl",
    { class: "facts" },
    el("dt", {}, "Status"),
    el("dd", { id: "job-status" }, statusBadge(j.status)),
    el("dt", {}, "Stage"),
    el("dd", { id: "job-stage" }, m.stage ? `${m.stage}${m.stageMessage ? ` — ${m.stageMessage}` : ""}` : "–"),
    el("dt", {}, "Queued"),
    el("dd", {}, `${j.started_at} UTC`),
    j.ended_at ? [el("dt", {}, "Ended"), el("dd", {}, `${j.ended_at} UTC`)] : null,
    j.output_path ? [el("dt", {}, "Output"), el("dd", { id: "job-output" }, el("code", {}, j.output_path))] : null,
    m.lastMetric ? [el("dt", {}, "Last step"), el("dd", {}, metricLine(m.lastMetric))] : null,
  );
  const summary = m.ended && m.ended.summary ? el("details", { open: true }, el("summary", {}, "Summary"), el("pre", { id: "job-summary" }, JSON.stringify(m.ended.summary, null, 2))) : null;
  const before = [
    el("h2", {}, `${j.kind} `, el("code", {}, j.id)),
    progressBar(m.progress),
    facts,
    j.error ? el("p", { class: "error", id: "job-error" }, j.error) : null,
    m.actionError ? el("p", { class: "error", id: "job-action-error" }, m.actionError) : null,
    m.actionNote ? el("p", { class: "hint", id: "job-action-note" }, m.actionNote) : null,
    m.streamError ? el("p", { class: "error" }, `events: ${m.streamError}`) : null,
  ];
  const after = [
    m.train.length || m.val.length ? lossChart(m.train, m.val) : null,
    summary,
    el("details", { open: true }, el("summary", {}, `Log (${m.log.length} lines)`), el("pre", { class: "log", id: "job-log" }, m.log.join("\n"))),
    el("details", {}, el("summary", {}, "Config"), el("pre", {}, config)),
  ];
  if (!m.parts || m.parts.before.parentNode !== node) {
    m.parts = { before: el("div", { class: "part" }), actions: el("div", { class: "part" }), after: el("div", { class: "part" }) };
    m.actionsKey = null;
    clear(node, m.parts.before, m.parts.actions, m.parts.after);
  }
  clear(m.parts.before, ...before);
  if (m.actionsKey !== actionsKey) {
    m.actionsKey = actionsKey;
    clear(m.parts.actions, actions);
  }
  clear(m.parts.after, ...after);
  const log = node.querySelector("#job-log");
  if (log) log.scrollTop = log.scrollHeight;
}

function metricLine(e) {
  const parts = [`step ${e.step}`, `loss ${fmtNumber(e.loss)}`];
  if (typeof e.learning_rate === "number") parts.push(`lr ${fmtNumber(e.learning_rate)}`);
  if (typeof e.tokens_per_sec === "number") parts.push(`${fmtNumber(e.tokens_per_sec)} tok/s`);
  if (typeof e.eta_s === "number") parts.push(`eta ${Math.round(e.eta_s)} s`);
  return parts.join(" · ");
}

// Train and validation loss against step, as two polylines over shared axes.
function lossChart(train, val) {
  const W = 640;
  const H = 220;
  const pad = { l: 52, r: 12, t: 12, b: 28 };
  const all = train.concat(val);
  let x0 = Math.min(...all.map((p) => p[0]));
  let x1 = Math.max(...all.map((p) => p[0]));
  let y0 = Math.min(...all.map((p) => p[1]));
  let y1 = Math.max(...all.map((p) => p[1]));
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) {
    y0 -= 0.5;
    y1 += 0.5;
  }
  const sx = (x) => pad.l + ((x - x0) / (x1 - x0)) * (W - pad.l - pad.r);
  const sy = (y) => H - pad.b - ((y - y0) / (y1 - y0)) * (H - pad.t - pad.b);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", id: "loss-chart", role: "img" });
  const axis = svg("path", { d: `M${pad.l},${pad.t} V${H - pad.b} H${W - pad.r}`, class: "axis" });
  chart.append(axis);
  const label = (x, y, text, anchor) => {
    const t = svg("text", { x, y, "text-anchor": anchor, class: "tick" });
    t.textContent = text;
    chart.append(t);
  };
  label(pad.l - 6, sy(y1) + 4, fmtNumber(y1), "end");
  label(pad.l - 6, sy(y0) + 4, fmtNumber(y0), "end");
  label(sx(x0), H - 8, String(x0), "start");
  label(sx(x1), H - 8, String(x1), "end");
  for (const [points, cls] of [[train, "train"], [val, "val"]]) {
    if (!points.length) continue;
    chart.append(svg("polyline", { points: points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "), class: `line ${cls}` }));
  }
  return el(
    "figure",
    {},
    chart,
    el("figcaption", {}, el("span", { class: "key train" }, "train loss"), " ", el("span", { class: "key val" }, "validation loss")),
  );
}
