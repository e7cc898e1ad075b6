// The page's router (#/chat, #/jobs[/ID | /new/KIND], #/status) and the API-key bar.
import { apiKey, onAuthNeeded, setApiKey } from "./api.js";
import { showChat } from "./chat.js";
import { el } from "./dom.js";
import { leaveJobs, showJobs } from "./jobs.js";
import { leaveStatus, showStatus } from "./status.js";

const main = document.getElementById("main");
const keyBar = document.getElementById("key-bar");

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, search] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const query = Object.fromEntries(new URLSearchParams(search || ""));
  const page = parts.shift() || "chat";
  leaveJobs();
  leaveStatus();
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
  if (page === "jobs") showJobs(main, parts, query);
  else if (page === "status") showStatus(main);
  else showChat(main);
}

function showKeyBar(message) {
  const input = el("input", { type: "password", id: "api-key", placeholder: "API key", autocomplete: "off", value: apiKey() });
  keyBar.replaceChildren(
    el("span", {}, message),
    input,
    el(
      "button",
      {
        id: "api-key-save",
        onclick: () => {
          setApiKey(input.value.trim());
          keyBar.hidden = true;
          route();
        },
      },
      "Use key",
    ),
    el("button", { class: "secondary", onclick: () => (keyBar.hidden = true) }, "Close"),
  );
  keyBar.hidden = false;
}

// Pages that poll keep getting 401 until a key is set: the bar is drawn once, not over what is being typed.
onAuthNeeded(() => {
  if (keyBar.hidden) showKeyBar("This server needs an API key (kept in this browser only).");
});
document.getElementById("key-button").addEventListener("click", () => showKeyBar("API key for this server:"));
window.addEventListener("hashchange", route);
route();
