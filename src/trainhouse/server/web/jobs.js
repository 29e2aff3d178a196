// The job list (#/jobs): server-side pages, sorting and filters, live rows.
import {
  POLL_MS,
  STATES,
  api,
  badge,
  debounce,
  h,
  metricsText,
  progressCell,
  timeCell,
} from "./core.js";

export const JOB_COLUMNS = [
  { key: "select", label: "" },
  { key: "id", label: "ID", sort: "id", first: "desc" },
  { key: "name", label: "Name", sort: "name", first: "asc" },
  { key: "owner", label: "Owner", sort: "owner", first: "asc" },
  { key: "state", label: "State", sort: "state", first: "asc" },
  { key: "priority", label: "Priority", sort: "priority", first: "desc" },
  { key: "progress", label: "Progress" },
  { key: "metrics", label: "Latest metrics" },
  { key: "created_at", label: "Submitted", sort: "created_at", first: "desc" },
];

export function jobsPage(view, query) {
  const st = {
    state: query.get("state") || "",
    owner: query.get("owner") || "",
    name: query.get("name") || "",
    sort: query.get("sort") || "id",
    order: query.get("order") === "asc" ? "asc" : "desc",
    page: Math.max(1, Number(query.get("page")) || 1),
    size: [25, 50, 100, 200].includes(Number(query.get("size"))) ? Number(query.get("size")) : 50,
  };
  const selected = new Set();
  let version = 0; // bumped by every change of filters/sort/page: older answers are dropped
  let shown = ""; // what the rows show now
  let total = 0;

  const changed = (resetPage = true) => {
    if (resetPage) st.page = 1;
    version += 1;
    const p = new URLSearchParams();
    for (const k of ["state", "owner", "name"]) if (st[k]) p.set(k, st[k]);
    if (st.sort !== "id") p.set("sort", st.sort);
    if (st.order !== "desc") p.set("order", st.order);
    if (st.page > 1) p.set("page", String(st.page));
    if (st.size !== 50) p.set("size", String(st.size));
    history.replaceState(null, "", "#/jobs" + (p.toString() ? `?${p}` : ""));
    poller.now();
  };

  const stateSel = h("select", { testid: "filter-state", "aria-label": "state", onchange: () => { st.state = stateSel.value; changed(); } },
    h("option", { value: "" }, "all states"),
    h("option", { value: "active" }, "active (not ended)"),
    STATES.map((s) => h("option", { value: s }, s)));
  stateSel.value = st.state;
  const owner = h("input", { type: "search", placeholder: "owner", value: st.owner, testid: "filter-owner", "aria-label": "owner",
    oninput: debounce(() => { st.owner = owner.value.trim(); changed(); }, 250) });
  const name = h("input", { type: "search", placeholder: "name contains…", value: st.name, testid: "filter-name", "aria-label": "name",
    oninput: debounce(() => { st.name = name.value.trim(); changed(); }, 250) });
  const compareBtn = h("button", { testid: "compare-selected", disabled: true,
    onclick: () => { location.hash = `#/compare?ids=${[...selected].join(",")}`; } }, "Compare selected");
  const count = h("span", { class: "muted", testid: "job-count" }, "");

  const head = h("tr");
  const tbody = h("tbody", { testid: "job-rows" });
  const table = h("table", { class: "grid jobs-table", testid: "jobs-table" }, h("thead", {}, head), tbody);

  const renderHead = () => {
    head.replaceChildren(...JOB_COLUMNS.map((c) => {
      if (!c.sort) return h("th", { class: `col-${c.key}` }, c.label);
      const active = st.sort === c.sort;
      return h("th", {
        class: `col-${c.key} sortable${active ? " sorted" : ""}`,
        "aria-sort": active ? (st.order === "asc" ? "ascending" : "descending") : "none",
        testid: `sort-${c.sort}`,
        onclick: () => {
          if (st.sort === c.sort) st.order = st.order === "asc" ? "desc" : "asc";
          else {
            st.sort = c.sort;
            st.order = c.first;
          }
          renderHead();
          changed();
        },
      }, c.label, h("span", { class: "arrow" }, active ? (st.order === "asc" ? " ▲" : " ▼") : ""));
    }));
  };
  renderHead();

  const pageInfo = h("span", { testid: "page-info" }, "");
  const pages = () => Math.max(1, Math.ceil(total / st.size));
  const go = (page) => {
    st.page = Math.min(Math.max(1, page), pages());
    changed(false);
  };
  const first = h("button", { testid: "page-first", onclick: () => go(1), title: "first page" }, "«");
  const prev = h("button", { testid: "page-prev", onclick: () => go(st.page - 1) }, "‹ Prev");
  const next = h("button", { testid: "page-next", onclick: () => go(st.page + 1) }, "Next ›");
  const last = h("button", { testid: "page-last", onclick: () => go(pages()), title: "last page" }, "»");
  const size = h("select", { testid: "page-size", "aria-label": "page size",
    onchange: () => { st.size = Number(size.value); changed(); } },
    [25, 50, 100, 200].map((n) => h("option", { value: String(n) }, `${n} per page`)));
  size.value = String(st.size);

  const row = (job) => {
    const box = h("input", { type: "checkbox", checked: selected.has(job.id), "aria-label": `select job ${job.id}`,
      onchange: () => {
        if (box.checked) selected.add(job.id);
        else selected.delete(job.id);
        compareBtn.disabled = selected.size < 1;
        compareBtn.textContent = selected.size ? `Compare selected (${selected.size})` : "Compare selected";
      } });
    const link = `#/jobs/${job.id}`;
    return h("tr", { testid: "job-row", "data-job-id": job.id, "data-state": job.state },
      h("td", { class: "col-select" }, box),
      h("td", { class: "col-id num" }, h("a", { href: link }, String(job.id))),
      h("td", { class: "col-name" }, h("a", { href: link, testid: "job-name" }, job.name),
        job.search_id ? [" ", h("a", { href: `#/searches/${job.search_id}`, class: "muted", testid: "job-search",
          title: "this job is a trial of a hyperparameter search" }, `search ${job.search_id}`)] : null),
      h("td", { class: "col-owner" }, h("a", { href: "#", class: "plain", title: `only ${job.owner}'s jobs`,
        onclick: (e) => { e.preventDefault(); owner.value = job.owner; st.owner = job.owner; changed(); } }, job.owner)),
      h("td", { class: "col-state", title: job.reason || "" }, badge(job.state, "state-badge")),
      h("td", { class: "col-priority" }, job.priority),
      h("td", { class: "col-progress" }, progressCell(job)),
      h("td", { class: "col-metrics", title: Object.entries(job.latest_metrics || {}).map(([k, v]) => `${k}: ${v}`).join("\n") },
        metricsText(job.latest_metrics)),
      h("td", { class: "col-created" }, timeCell(job.created_at)));
  };

  const params = () => {
    const p = new URLSearchParams({ limit: String(st.size), offset: String((st.page - 1) * st.size), sort: st.sort, order: st.order });
    if (st.state === "") p.set("all", "true");
    else if (st.state !== "active") p.set("state", st.state);
    if (st.owner) p.set("owner", st.owner);
    if (st.name) p.set("name", st.name);
    return p;
  };

  const poller = view.poll(async () => {
    const asked = version;
    const data = await api(`/jobs?${params()}`);
    if (asked !== version || !view.alive) return;
    total = data.total ?? data.jobs.length;
    if (!data.jobs.length && total > 0 && st.page > 1) {
      go(pages()); // the page emptied (filters changed, jobs went away): show the last one
      return;
    }
    const key = JSON.stringify([asked, total, data.jobs, Math.floor(Date.now() / 30000)]);
    if (key === shown) return; // unchanged: leave the rows (and a click on them) alone
    shown = key;
    tbody.replaceChildren(...(data.jobs.length ? data.jobs.map(row)
      : [h("tr", { class: "empty" }, h("td", { colspan: String(JOB_COLUMNS.length) },
        st.state || st.owner || st.name ? "No job matches these filters."
          : "No jobs yet. Submit one: trainhouse submit job.yaml"))]));
    const from = total ? (st.page - 1) * st.size + 1 : 0;
    const to = (st.page - 1) * st.size + data.jobs.length;
    count.textContent = `${total.toLocaleString()} job${total === 1 ? "" : "s"}`;
    pageInfo.textContent = `${from.toLocaleString()}–${to.toLocaleString()} of ${total.toLocaleString()} · page ${st.page} of ${pages().toLocaleString()}`;
    first.disabled = prev.disabled = st.page <= 1;
    next.disabled = last.disabled = st.page >= pages();
  }, POLL_MS);

  return h("section", { class: "page jobs" },
    h("div", { class: "toolbar" }, h("h1", {}, "Jobs"), count, h("span", { class: "spacer" }),
      stateSel, owner, name, compareBtn),
    h("div", { class: "table-wrap" }, table),
    h("div", { class: "pager" }, first, prev, pageInfo, next, last, size));
}
