// The job list (#/jobs): server-side pages, sorting and filters, live rows; columns a user
// hides (kept in the URL and in this browser) and chooses (hparams, metrics, note...: right
// after the state, so that they stay in view), and each row's actions (runactions.js).
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
import { actionPanel, mayChange } from "./runactions.js";
import { jobState } from "./search.js";

// the fixed columns, in order; the chosen ones come after the state. Any but the first two
// (select, actions) may be hidden.
export const JOB_COLUMNS = [
  { key: "select", label: "" },
  { key: "actions", label: "" },
  { key: "id", label: "ID", sort: "id", first: "desc" },
  { key: "name", label: "Name", sort: "name", first: "asc" },
  { key: "state", label: "State", sort: "state", first: "asc" },
  { key: "owner", label: "Owner", sort: "owner", first: "asc" },
  { key: "priority", label: "Priority", sort: "priority", first: "desc" },
  { key: "progress", label: "Progress" },
  { key: "metrics", label: "Latest metrics" },
  { key: "created_at", label: "Submitted", sort: "created_at", first: "desc" },
];
const FIXED = new Set(["select", "actions"]);
const HIDDEN_KEY = "trainhouse.jobs.hidden"; // this browser's hidden columns, when the URL names none
const TEXT_FIELDS = new Set(["note", "reason", "tag"]); // shown, filtered, never sorted

/** A chosen column's cell text: a job field's own value (the note's first line, the live
 * reason, the tags), else the list's ``values`` (hparams, metrics, datasets). */
function valueText(job, field) {
  if (field === "note" || field === "reason") return ((job[field] || "").split("\n")[0]) || "—";
  if (field === "tag") return (job.tags || []).join(", ") || "—";
  const values = job.values || {};
  const v = field in values ? values[field] : (field.includes(".") ? undefined : job[field]);
  if (v === undefined || v === null) return "—";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2).replace(/e([+-])(\d)$/, "e$10$2"); // 5.37e-04, as ps
  return Number(v.toPrecision(4)).toString();
}

function storedHidden() {
  try {
    return localStorage.getItem(HIDDEN_KEY) || "";
  } catch {
    return "";
  }
}

export function jobsPage(view, query) {
  const st = {
    state: query.get("state") || "",
    owner: query.get("owner") || "",
    name: query.get("name") || "",
    where: query.get("where") || "",
    columns: query.get("columns") || "",
    hide: new Set((query.get("hide") ?? storedHidden()).split(",").map((c) => c.trim()).filter(Boolean)),
    project: query.get("project") || "",
    tag: query.get("tag") || "",
    archived: query.get("archived") === "include" ? "include" : "exclude",
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
    for (const k of ["state", "owner", "name", "where", "columns", "project", "tag"]) if (st[k]) p.set(k, st[k]);
    if (st.archived !== "exclude") p.set("archived", st.archived);
    if (st.sort !== "id") p.set("sort", st.sort);
    if (st.order !== "desc") p.set("order", st.order);
    if (st.page > 1) p.set("page", String(st.page));
    if (st.size !== 50) p.set("size", String(st.size));
    if (st.hide.size) p.set("hide", [...st.hide].join(","));
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
  // the runs table: a filter in the expression language, chosen columns, project and tag
  const whereMsg = h("div", { class: "error where-error", testid: "filter-where-error", hidden: true });
  const columnsMsg = h("div", { class: "error where-error", testid: "columns-error", hidden: true });
  const where = h("input", { type: "search", class: "where", value: st.where, testid: "filter-where", "aria-label": "filter",
    placeholder: "filter: metrics.val_loss.min < 0.1 and hparams.lr >= 1e-3 and state = COMPLETED",
    onkeydown: (e) => { if (e.key === "Enter") { st.where = where.value.trim(); changed(); } },
    onsearch: () => { if (!where.value) { st.where = ""; changed(); } } });
  const known = h("datalist", { id: "run-fields" });
  const columns = h("input", { type: "text", value: st.columns, testid: "columns-input", "aria-label": "columns", list: "run-fields",
    placeholder: "columns: hparams.lr, metrics.loss.min",
    onkeydown: (e) => { if (e.key === "Enter") { st.columns = columns.value.replace(/\s+/g, ""); renderHead(); renderMenu(); changed(); } } });
  const projectSel = h("select", { testid: "filter-project", "aria-label": "project",
    onchange: () => { st.project = projectSel.value; changed(); } }, h("option", { value: "" }, "all projects"));
  const tagSel = h("select", { testid: "filter-tag", "aria-label": "tag",
    onchange: () => { st.tag = tagSel.value; changed(); } }, h("option", { value: "" }, "any tag"));
  const archivedBox = h("input", { type: "checkbox", checked: st.archived === "include", testid: "filter-archived",
    onchange: () => { st.archived = archivedBox.checked ? "include" : "exclude"; changed(); } });
  api("/runs/columns").then((c) => {
    const opts = (sel, values, wanted) => {
      for (const v of values) sel.append(h("option", { value: v }, v));
      if (wanted && !values.includes(wanted)) sel.append(h("option", { value: wanted }, wanted));
      sel.value = wanted;
    };
    opts(projectSel, c.projects, st.project);
    opts(tagSel, c.tags, st.tag);
    known.replaceChildren(...c.hparams.map((k) => h("option", { value: `hparams.${k}` })),
      ...c.metrics.flatMap((m) => ["last", "min", "max"].map((a) => h("option", { value: `metrics.${m}.${a}` }))));
  }).catch(() => {});
  const chosen = () => [...new Set(st.columns.split(",").map((c) => c.trim()).filter(Boolean))];

  // the columns shown: the fixed ones not hidden, the chosen ones not hidden right after the state
  const shownColumns = () => {
    const fixed = JOB_COLUMNS.filter((c) => FIXED.has(c.key) || !st.hide.has(c.key));
    const extra = chosen().filter((f) => !st.hide.has(f)).map((f) => ({ key: "value", field: f, label: f,
      sort: TEXT_FIELDS.has(f) || f.startsWith("datasets.") ? null : f, first: f.startsWith("metrics.") ? "asc" : "desc" }));
    const lead = ["select", "actions", "id", "name", "state"];
    let at = 0;
    while (at < fixed.length && lead.includes(fixed[at].key)) at += 1;
    return [...fixed.slice(0, at), ...extra, ...fixed.slice(at)];
  };
  // the Columns menu: a box per column, ticked when shown
  const menuList = h("div", { class: "column-menu-list" });
  const menu = h("details", { class: "column-menu", testid: "columns-menu" },
    h("summary", { testid: "columns-menu-open" }, "Columns"), menuList);
  const renderMenu = () => {
    const all = [...JOB_COLUMNS.filter((c) => !FIXED.has(c.key)).map((c) => [c.key, c.label]), ...chosen().map((f) => [f, f])];
    menuList.replaceChildren(...all.map(([key, label]) => {
      const box = h("input", { type: "checkbox", checked: !st.hide.has(key), testid: `column-toggle-${key}`,
        onchange: () => {
          if (box.checked) st.hide.delete(key);
          else st.hide.add(key);
          try { localStorage.setItem(HIDDEN_KEY, [...st.hide].join(",")); } catch { /* private mode: the URL keeps it */ }
          shown = "";
          renderHead();
          changed(false);
        } });
      return h("label", { class: "small" }, box, " ", label);
    }));
  };
  renderMenu();

  const compareBtn = h("button", { testid: "compare-selected", disabled: true,
    onclick: () => { location.hash = `#/compare?ids=${[...selected].join(",")}`; } }, "Compare selected");
  const count = h("span", { class: "muted", testid: "job-count" }, "");

  const head = h("tr");
  const tbody = h("tbody", { testid: "job-rows" });
  const table = h("table", { class: "grid jobs-table", testid: "jobs-table" }, h("thead", {}, head), tbody);

  // a chosen field's name (metrics.val_acc.max) may wrap after its dots, never inside a word
  const label = (c) => (c.field ? c.label.split(/(?<=\.)/).flatMap((part, i) => (i ? [h("wbr"), part] : [part])) : c.label);
  const renderHead = () => {
    head.replaceChildren(...shownColumns().map((c) => {
      if (!c.sort) return h("th", { class: `col-${c.key}`, "data-field": c.field ?? null, testid: c.field ? `head-${c.field}` : null }, label(c));
      const active = st.sort === c.sort;
      return h("th", {
        class: `col-${c.key} sortable${active ? " sorted" : ""}`,
        "data-field": c.field ?? null,
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
      }, label(c), h("span", { class: "arrow" }, active ? (st.order === "asc" ? " ▲" : " ▼") : ""));
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

  let me = null; // who the server takes us for: whether a row gets its actions
  const panel = actionPanel(() => { shown = ""; poller.now(); });
  api("/whoami").then((who) => {
    me = who;
    table.dataset.who = who.name; // the rows' actions follow from now on
    shown = "";
    poller.now();
  }).catch(() => {});

  const row = (job) => {
    const box = h("input", { type: "checkbox", checked: selected.has(job.id), "aria-label": `select job ${job.id}`,
      onchange: () => {
        if (box.checked) selected.add(job.id);
        else selected.delete(job.id);
        compareBtn.disabled = selected.size < 1;
        compareBtn.textContent = selected.size ? `Compare selected (${selected.size})` : "Compare selected";
      } });
    const link = `#/jobs/${job.id}`;
    const cells = {
      select: () => h("td", { class: "col-select" }, box),
      actions: () => h("td", { class: "col-actions" }, mayChange(me, job)
        ? h("button", { class: "plain", testid: "row-actions", "aria-label": `actions for job ${job.id}`,
          title: "tag, move to a project, archive, delete", onclick: () => panel.open(job) }, "⋯")
        : null),
      id: () => h("td", { class: "col-id num" }, h("a", { href: link }, String(job.id))),
      name: () => h("td", { class: "col-name" }, h("a", { href: link, testid: "job-name" }, job.name),
        job.search_id ? [" ", h("a", { href: `#/searches/${job.search_id}`, class: "muted", testid: "job-search",
          title: "this job is a trial of a hyperparameter search" }, `search ${job.search_id}`)] : null),
      owner: () => h("td", { class: "col-owner" }, h("a", { href: "#", class: "plain", title: `only ${job.owner}'s jobs`,
        onclick: (e) => { e.preventDefault(); owner.value = job.owner; st.owner = job.owner; changed(); } }, job.owner)),
      state: () => h("td", { class: "col-state", title: job.reason || "" }, badge(jobState(job), "state-badge")),
      priority: () => h("td", { class: "col-priority" }, job.priority),
      progress: () => h("td", { class: "col-progress" }, progressCell(job)),
      metrics: () => h("td", { class: "col-metrics", title: Object.entries(job.latest_metrics || {}).map(([k, v]) => `${k}: ${v}`).join("\n") },
        metricsText(job.latest_metrics)),
      created_at: () => h("td", { class: "col-created" }, timeCell(job.created_at)),
    };
    return h("tr", { testid: "job-row", "data-job-id": job.id, "data-state": job.state },
      shownColumns().map((c) => (c.field
        ? h("td", { class: `col-value${TEXT_FIELDS.has(c.field) ? " text" : " num"}`, "data-field": c.field, title: c.field === "note" ? job.note || "" : null }, valueText(job, c.field))
        : cells[c.key]())));
  };

  const params = () => {
    const p = new URLSearchParams({ limit: String(st.size), offset: String((st.page - 1) * st.size), sort: st.sort, order: st.order });
    if (st.state === "") p.set("all", "true");
    else if (st.state !== "active") p.set("state", st.state);
    if (st.owner) p.set("owner", st.owner);
    if (st.name) p.set("name", st.name);
    if (st.where) p.set("where", st.where);
    if (st.columns) p.set("columns", st.columns);
    if (st.project) p.set("project", st.project);
    if (st.tag) p.set("tag", st.tag);
    if (st.archived !== "exclude") p.set("archived", st.archived);
    return p;
  };

  const poller = view.poll(async () => {
    const asked = version;
    let data;
    try {
      data = await api(`/jobs?${params()}`);
    } catch (err) {
      if (asked !== version || !view.alive || err.status !== 422) throw err;
      // under the box it is about: the columns' errors say "columns: ..."; the filter's point
      // at the bad token, its column and a caret
      const aboutColumns = err.message.startsWith("columns: ");
      columnsMsg.textContent = aboutColumns ? err.message : "";
      columnsMsg.hidden = !aboutColumns;
      whereMsg.textContent = aboutColumns ? "" : err.message;
      whereMsg.hidden = aboutColumns;
      tbody.replaceChildren(h("tr", { class: "empty" }, h("td", { colspan: String(shownColumns().length) },
        aboutColumns ? "No rows: a column is not one the table knows (see above)." : "No rows: the filter has an error (see above).")));
      // no count of rows the page does not show
      total = 0;
      count.textContent = "";
      pageInfo.textContent = "no rows shown";
      first.disabled = prev.disabled = next.disabled = last.disabled = true;
      shown = "";
      return;
    }
    whereMsg.hidden = true;
    columnsMsg.hidden = true;
    if (asked !== version || !view.alive) return;
    total = data.total ?? data.jobs.length;
    if (!data.jobs.length && total > 0 && st.page > 1) {
      go(pages()); // the page emptied (filters changed, jobs went away): show the last one
      return;
    }
    const key = JSON.stringify([asked, total, data.jobs, Math.floor(Date.now() / 30000), me && me.name]);
    if (key === shown) return; // unchanged: leave the rows (and a click on them) alone
    shown = key;
    tbody.replaceChildren(...(data.jobs.length ? data.jobs.map(row)
      : [h("tr", { class: "empty" }, h("td", { colspan: String(shownColumns().length) },
        st.state || st.owner || st.name || st.where || st.project || st.tag ? "No job matches these filters."
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
      stateSel, projectSel, tagSel, owner, name, compareBtn),
    h("div", { class: "toolbar runs-filter" }, where, columns, known, menu,
      h("label", { class: "small" }, archivedBox, " archived")),
    whereMsg,
    columnsMsg,
    panel.el,
    h("div", { class: "table-wrap" }, table),
    h("div", { class: "pager" }, first, prev, pageInfo, next, last, size));
}
