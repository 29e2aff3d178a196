// trainhouse dashboard: one page, hash routes, plain DOM, polling the REST API under /api/v1.
// Routes: #/jobs  #/jobs/<id>  #/compare?ids=1,2  #/queue  #/nodes  #/searches  #/searches/<id>
//         #/models  #/models/<name>[?version=N]  #/services  #/services/<name>
//         #/datasets  #/datasets/<name>[?version=N]  #/flows  #/flows/<id>
// Plain ES modules, no build step. Charts are plotly.js (window.Plotly, served from the
// installed `plotly` wheel); a chart's element keeps what it plots as plotly does:
// el.data[i].x / el.data[i].y, raw series first.
import { nodesPage, queuePage } from "./cluster.js";
import { comparePage } from "./compare.js";
import { ApiError, View, api, h } from "./core.js";
import { datasetPage, datasetsPage } from "./datasets.js";
import { flowPage, flowsPage } from "./flows.js";
import { jobPage } from "./job.js";
import { jobsPage } from "./jobs.js";
import { searchPage, searchesPage } from "./search.js";
import { modelPage, modelsPage } from "./models.js";
import { servicePage, servicesPage } from "./services.js";

const ROUTES = [
  [/^\/jobs\/(\d+)$/, "jobs", (view, m) => jobPage(view, Number(m[1]))],
  // MLflow's own link to a run (/mlflow/#/experiments/E/runs/R lands here): the run is job R
  [/^\/experiments\/\d+\/runs\/(\d+)$/, "jobs", (view, m) => jobPage(view, Number(m[1]))],
  [/^\/jobs$/, "jobs", (view, _m, q) => jobsPage(view, q)],
  [/^\/compare$/, "compare", (view, _m, q) => comparePage(view, q)],
  [/^\/queue$/, "queue", (view) => queuePage(view)],
  [/^\/nodes$/, "nodes", (view) => nodesPage(view)],
  [/^\/searches\/(\d+)$/, "searches", (view, m) => searchPage(view, Number(m[1]))],
  [/^\/searches$/, "searches", (view) => searchesPage(view)],
  [/^\/flows\/(\d+)$/, "flows", (view, m) => flowPage(view, Number(m[1]))],
  [/^\/flows$/, "flows", (view) => flowsPage(view)],
  [/^\/models$/, "models", (view) => modelsPage(view)],
  [/^\/models\/([A-Za-z0-9._-]+)$/, "models", (view, m, q) => modelPage(view, m[1], q.get("version"))],
  [/^\/services$/, "services", (view) => servicesPage(view)],
  [/^\/services\/([A-Za-z0-9._-]+)$/, "services", (view, m) => servicePage(view, m[1])],
  [/^\/datasets$/, "datasets", (view) => datasetsPage(view)],
  [/^\/datasets\/([A-Za-z0-9._-]+)$/, "datasets", (view, m, q) => datasetPage(view, m[1], q.get("version"))],
];

let current = null;

function route() {
  const hash = location.hash.replace(/^#/, "") || "/jobs";
  const [path, search] = hash.split("?");
  if (current) current.stop();
  current = new View();
  const main = document.getElementById("view");
  document.title = "trainhouse";
  for (const [re, nav, make] of ROUTES) {
    const m = path.match(re);
    if (!m) continue;
    for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === nav);
    main.replaceChildren(make(current, m, new URLSearchParams(search || "")));
    return;
  }
  // no tab is this page's: none stays highlighted from the page before
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.remove("active");
  main.replaceChildren(h("section", { class: "page", testid: "not-found-page" }, h("h1", {}, "Not found"),
    h("p", {}, `No page at #${hash}. `, h("a", { href: "#/jobs" }, "Back to the jobs"))));
}

// -- signing in (servers with auth on): a token goes into an HttpOnly session cookie
let signingIn = false;

function signInPage(message) {
  if (signingIn) return;
  signingIn = true;
  if (current) current.stop();
  current = null;
  const input = h("input", { type: "password", name: "token", autocomplete: "current-password",
    placeholder: "thu_…", testid: "signin-token", required: true });
  const error = h("p", { class: "error", testid: "signin-error", hidden: !message }, message || "");
  const form = h("form", { class: "signin", testid: "signin" },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "This server needs an API token. Make one with ",
      h("code", {}, "trainhouse admin token create"), " (or ask an admin)."),
    input, h("button", { type: "submit", testid: "signin-submit" }, "Sign in"), error);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await api("/session", { method: "POST", body: JSON.stringify({ token: input.value.trim() }),
        headers: { "Content-Type": "application/json" } });
      signingIn = false;
      await showUser();
      route();
    } catch (err) {
      error.hidden = false;
      error.textContent = err instanceof ApiError ? err.message : String(err);
    }
  });
  document.getElementById("view").replaceChildren(h("section", { class: "page" }, form));
  input.focus();
}

async function showUser() {
  const slot = document.getElementById("user");
  try {
    const me = await api("/whoami");
    if (!me.auth) { slot.replaceChildren(); return true; }
    const out = h("a", { href: "#", testid: "signout", onclick: async (ev) => {
      ev.preventDefault();
      await fetch("/api/v1/session", { method: "DELETE", credentials: "same-origin" });
      slot.replaceChildren();
      signInPage("Signed out.");
    } }, "sign out");
    slot.replaceChildren(h("span", { testid: "user" }, `${me.name} (${me.role}) `), out);
    return true;
  } catch (err) {
    return !(err instanceof ApiError && err.status === 401);
  }
}

window.addEventListener("trainhouse:signin", () => signInPage("Your session ended or the token was refused; sign in again."));
window.addEventListener("hashchange", () => { if (!signingIn) route(); });
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && current) current.wake();
});
if (!location.hash) history.replaceState(null, "", "#/jobs");
showUser().then((ok) => { if (ok) route(); else signInPage(""); });
