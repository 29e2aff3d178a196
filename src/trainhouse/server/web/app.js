// trainhouse dashboard: one page, hash routes, plain DOM, polling the REST API under /api/v1.
// Routes: #/jobs  #/jobs/<id>  #/compare?ids=1,2  #/queue  #/nodes
// Plain ES modules, no build step. Charts are plotly.js (window.Plotly, served from the
// installed `plotly` wheel); a chart's element keeps what it plots as plotly does:
// el.data[i].x / el.data[i].y, raw series first.
import { nodesPage, queuePage } from "./cluster.js";
import { comparePage } from "./compare.js";
import { View, h } from "./core.js";
import { jobPage } from "./job.js";
import { jobsPage } from "./jobs.js";

const ROUTES = [
  [/^\/jobs\/(\d+)$/, "jobs", (view, m) => jobPage(view, Number(m[1]))],
  [/^\/jobs$/, "jobs", (view, _m, q) => jobsPage(view, q)],
  [/^\/compare$/, "compare", (view, _m, q) => comparePage(view, q)],
  [/^\/queue$/, "queue", (view) => queuePage(view)],
  [/^\/nodes$/, "nodes", (view) => nodesPage(view)],
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
  main.replaceChildren(h("section", { class: "page" }, h("h1", {}, "Not found"),
    h("p", {}, `No page at #${hash}. `, h("a", { href: "#/jobs" }, "Back to the jobs"))));
}

window.addEventListener("hashchange", route);
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && current) current.wake();
});
if (!location.hash) history.replaceState(null, "", "#/jobs");
route();
