// The forms that submit jobs. Quantize, fine-tune and fuse fields are listed here (the server validates them again
// and names a bad one); dataset forms are built from the templates the server describes
// (GET /api/dataset/templates), so a new template needs no change here.
import { getJson, postJson } from "./api.js";
import { clear, el } from "./dom.js";

const QUANTIZE = [
  { name: "model", label: "Source checkpoint (folder)", type: "text", required: true, hint: "a Hugging Face bf16/f16/f32 checkpoint" },
  { name: "out", label: "Output folder", type: "text", required: true },
  { name: "bits", label: "Bits", type: "select", options: ["4", "2", "3", "5", "6", "8"], number: true },
  { name: "group_size", label: "Group size", type: "select", options: ["64", "32", "128"], number: true },
  {
    name: "recipe",
    label: "Recipe",
    type: "select",
    options: ["uniform", "embed_8", "mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"],
  },
  { name: "eval_tokens", label: "KL check tokens", type: "number", hint: "0 skips the KL check against the source" },
];

const FUSE = [
  { name: "model", label: "Base model (folder)", type: "text", required: true, hint: "the model the adapter was trained on" },
  { name: "adapter", label: "Adapter folder", type: "text", required: true },
  { name: "out", label: "Output folder", type: "text", required: true },
  { name: "dequantize", label: "Write dense weights", type: "checkbox", hint: "instead of re-quantizing like the base" },
];

// Empty fields are left out, so the server's defaults (shown as placeholders) apply.
const FINETUNE = [
  { name: "model_dir", label: "Base model (MLX folder)", type: "text", required: true },
  { name: "data_dir", label: "Dataset folder", type: "text", required: true, hint: "train.jsonl and valid.jsonl" },
  { name: "adapter_path", label: "Adapter output folder", type: "text", required: true },
  { name: "method", label: "Method", type: "select", options: ["sft", "dpo", "orpo"] },
  { name: "rank", label: "LoRA rank", type: "number", placeholder: "8" },
  { name: "scale", label: "LoRA scale", type: "number", placeholder: "1" },
  { name: "num_layers", label: "Layers adapted, from the top", type: "number", placeholder: "all" },
  { name: "iters", label: "Iterations", type: "number", placeholder: "100" },
  { name: "batch_size", label: "Batch size", type: "number", placeholder: "1" },
  { name: "learning_rate", label: "Learning rate", type: "number", placeholder: "by method" },
  { name: "max_seq_length", label: "Max sequence length", type: "number", placeholder: "512" },
  { name: "save_every", label: "Checkpoint every N steps", type: "number", placeholder: "off" },
  { name: "early_stop_patience", label: "Early stop after N evaluations without a better validation loss", type: "number", placeholder: "off" },
  { name: "device", label: "Device", type: "select", options: ["cpu", "cuda"] },
];

// Builds the inputs for `fields` into `form`; returns a function that reads them into a config object.
function fieldInputs(form, fields, preset) {
  const readers = [];
  for (const f of fields) {
    const id = `field-${f.name}`;
    const initial = preset[f.name] ?? f.default ?? "";
    let input;
    if (f.type === "select")
      input = el(
        "select",
        { id, name: f.name },
        f.options.map((o) => el("option", { value: o, selected: String(initial) === o }, o)),
      );
    else if (f.type === "textarea") input = el("textarea", { id, name: f.name, rows: 6, value: String(initial) });
    else if (f.type === "checkbox") input = el("input", { id, name: f.name, type: "checkbox", checked: Boolean(initial) });
    else
      input = el("input", {
        id,
        name: f.name,
        type: f.type === "number" ? "number" : "text",
        step: f.type === "number" ? (f.integer ? 1 : "any") : undefined,
        min: f.type === "number" ? f.min : undefined,
        max: f.type === "number" ? f.max : undefined,
        value: String(initial),
        placeholder: f.placeholder,
        required: Boolean(f.required),
      });
    form.append(
      el(
        "label",
        { class: "field" },
        el("span", {}, f.label || f.name, f.required ? " *" : ""),
        input,
        f.hint ? el("small", {}, f.hint) : null,
      ),
    );
    readers.push((config) => {
      if (f.type === "checkbox") {
        config[f.name] = input.checked;
        return;
      }
      const v = input.value;
      if (v === "") return;
      config[f.name] = f.type === "number" || f.number ? Number(v) : v;
    });
  }
  return (config) => {
    for (const r of readers) r(config);
    return config;
  };
}

function extraJson(form) {
  const area = el("textarea", { id: "field-extra", rows: 3, placeholder: '{"lr_schedule": "cosine"}' });
  form.append(
    el(
      "details",
      {},
      el("summary", {}, "More config (JSON)"),
      el("label", { class: "field" }, el("span", {}, "Fields merged into the config"), area),
    ),
  );
  return () => {
    if (!area.value.trim()) return {};
    let v;
    try {
      v = JSON.parse(area.value);
    } catch (e) {
      throw new Error(`More config: not JSON (${e.message})`);
    }
    if (!v || typeof v !== "object" || Array.isArray(v)) throw new Error("More config: must be a JSON object");
    return v;
  };
}

function submitter(form, kind, read) {
  const status = el("p", { class: "form-status", id: "form-status", role: "status" });
  const button = el("button", { type: "submit", id: "job-submit" }, `Start ${kind} job`);
  form.append(el("div", { class: "row" }, button), status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    status.className = "form-status";
    let config;
    try {
      config = read();
    } catch (e) {
      status.className = "form-status error";
      status.textContent = e.message;
      return;
    }
    button.disabled = true;
    status.textContent = "submitting…";
    try {
      const answer = await postJson("/api/jobs", { kind, config });
      location.hash = `#/jobs/${answer.job.id}`;
    } catch (e) {
      status.className = "form-status error";
      status.textContent = e.message;
    } finally {
      button.disabled = false;
    }
  });
}

export async function showJobForm(container, kind, preset) {
  const form = el("form", { class: "job-form", id: `form-${kind}`, novalidate: true });
  clear(container, el("h2", {}, `New ${kind} job`), form);
  const FIELDS = { quantize: QUANTIZE, finetune: FINETUNE, fuse: FUSE };
  if (FIELDS[kind]) {
    const read = fieldInputs(form, FIELDS[kind], preset);
    const extra = extraJson(form);
    submitter(form, kind, () => ({ ...read({}), ...extra() }));
    return;
  }
  if (kind !== "dataset") {
    form.append(el("p", { class: "error" }, `unknown job kind '${kind}'`));
    return;
  }
  let templates;
  try {
    const answer = await getJson("/api/dataset/templates");
    templates = Array.isArray(answer) ? answer : answer.templates || answer.data || [];
  } catch (e) {
    form.append(el("p", { class: "error" }, `dataset templates: ${e.message}`));
    return;
  }
  const chosen = templates.find((t) => t.id === preset.template) || templates[0];
  if (!chosen) {
    form.append(el("p", { class: "error" }, "the server offers no dataset templates"));
    return;
  }
  const picker = el(
    "select",
    {
      id: "field-template",
      onchange: (ev) => showJobForm(container, "dataset", { ...preset, template: ev.target.value }),
    },
    templates.map((t) => el("option", { value: t.id, selected: t.id === chosen.id }, t.label || t.id)),
  );
  form.append(
    el("label", { class: "field" }, el("span", {}, "Template"), picker),
    el("p", { class: "hint" }, chosen.description || ""),
    chosen.needs_llm ? el("p", { class: "hint" }, "This template asks the served model to write its rows.") : null,
  );
  const fields = [{ name: "out", label: "Output folder", type: "text", required: true, hint: "train.jsonl and valid.jsonl go here" }];
  for (const f of chosen.fields || []) {
    if (f.name === "out") continue;
    fields.push(f);
    // A long text can sit in a file on the server instead (a job's config holds at most 16 KiB).
    if (f.file_field)
      fields.push({
        name: f.file_field,
        label: `…or ${(f.label || f.name).toLowerCase()} from a file on the server`,
        type: "text",
        hint: "a path the server reads instead of the text above (up to 64 MiB)",
      });
  }
  const read = fieldInputs(form, fields, preset);
  submitter(form, "dataset", () => read({ template: chosen.id }));
}
