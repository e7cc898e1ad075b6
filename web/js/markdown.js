// A small Markdown renderer for answers: fenced code, headings, lists, block quotes, paragraphs, and inline
// code, bold, italics and http(s) links. It builds DOM nodes (text always through text nodes), so markup in
// an answer shows as text and no link can carry a javascript: URL.
import { el } from "./dom.js";

// Inline spans of one line of text -> nodes.
function inline(text) {
  const out = [];
  const pattern = /`([^`]+)`|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;
  let last = 0;
  for (let m; (m = pattern.exec(text)); ) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[1] !== undefined) out.push(el("code", {}, m[1]));
    else if (m[2] !== undefined || m[3] !== undefined) out.push(el("strong", {}, m[2] ?? m[3]));
    else if (m[4] !== undefined) out.push(el("em", {}, m[4]));
    else out.push(el("a", { href: m[6], target: "_blank", rel: "noopener noreferrer" }, m[5]));
    last = pattern.lastIndex;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

function withBreaks(lines) {
  const out = [];
  lines.forEach((line, i) => {
    if (i) out.push(el("br"));
    out.push(...inline(line));
  });
  return out;
}

// Markdown text (possibly cut mid-stream) -> a fragment.
export function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  const lines = text.split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = /^\s*(```|~~~)\s*([\w+-]*)/.exec(line);
    if (fence) {
      const body = [];
      for (i++; i < lines.length && !lines[i].trimStart().startsWith(fence[1]); i++) body.push(lines[i]);
      i++; // the closing fence (or the end of a stream still writing the block)
      root.append(el("pre", { class: "code", dataset: fence[2] ? { lang: fence[2] } : {} }, el("code", {}, body.join("\n"))));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      root.append(el(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2])));
      i++;
      continue;
    }
    const item = /^\s*([-*+]|\d+[.)])\s+/;
    if (item.test(line)) {
      const ordered = /^\s*\d/.test(line);
      const list = el(ordered ? "ol" : "ul");
      for (; i < lines.length && item.test(lines[i]); i++) list.append(el("li", {}, inline(lines[i].replace(item, ""))));
      root.append(list);
      continue;
    }
    if (/^\s*>/.test(line)) {
      const quoted = [];
      for (; i < lines.length && /^\s*>/.test(lines[i]); i++) quoted.push(lines[i].replace(/^\s*>\s?/, ""));
      root.append(el("blockquote", {}, withBreaks(quoted)));
      continue;
    }
    if (!line.trim()) {
      i++;
      continue;
    }
    const para = [];
    for (; i < lines.length && lines[i].trim() && !/^\s*(```|~~~|#{1,6}\s|>|[-*+]\s|\d+[.)]\s)/.test(lines[i]); i++)
      para.push(lines[i]);
    if (!para.length) para.push(lines[i++]);
    root.append(el("p", {}, withBreaks(para)));
  }
  return root;
}
