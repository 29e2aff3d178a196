// Compare's numbers (GET /runs/compare): a row per job, and per metric its final value, its
// best (by the metric's goal: the server says which and why; with none known, min and max)
// and the mean of its last N points. A click on a column's head sorts the rows by it (again:
// the other way); a column whose values differ between the jobs is highlighted, and in it the
// best job's cell is marked.
import { fmtNum, h } from "./core.js";

const ARROW = { min: "↓", max: "↑" };

/** The columns of one metric: [{key, label, title, better}] (better: "min", "max" or null). */
function metricColumns(m, last) {
  const goal = m.goal ? `${m.goal === "min" ? "lower" : "higher"} is better (from ${m.goal_from})` : "";
  const cols = [{ key: "final", label: "final", title: "The value at the last step", better: m.goal }];
  if (m.goal) {
    cols.push({ key: "best", label: `best (${m.goal})`, title: `${m.goal === "min" ? "The smallest" : "The largest"} value: ${goal}`, better: m.goal });
  } else {
    const unknown = "No goal known for this metric (not a search's or checkpoints.metric, and its name says neither)";
    cols.push({ key: "min", label: "min", title: unknown, better: null });
    cols.push({ key: "max", label: "max", title: unknown, better: null });
  }
  cols.push({ key: "last_mean", label: `mean last ${last}`, title: `The mean of the last ${last} points`, better: m.goal });
  return cols;
}

/** The table for the server's answer `data`; `names`: only these metrics (null: all);
 * `state`: {sort: "metric\u0000key", order: "asc"|"desc"}, kept by the caller across redraws;
 * `jobs`: id -> job (for the names); `colors`: id -> the job's colour on the charts. */
export function numbersTable(data, { names = null, state, jobs, colors, onsort }) {
  const metrics = data.metrics.filter((m) => !names || names.has(m.name));
  if (!metrics.length) return h("p", { class: "muted", testid: "compare-numbers" }, "No metrics to sum up yet.");
  const ids = data.job_ids;
  const cells = new Map(); // metric name -> job id -> run numbers
  for (const m of metrics) cells.set(m.name, new Map(m.runs.map((r) => [r.job_id, r])));
  const value = (name, key, id) => {
    const r = cells.get(name).get(id);
    return r ? r[key] : undefined;
  };
  const rows = [...ids];
  if (state.sort) {
    const [name, key] = state.sort.split("\u0000");
    if (cells.has(name)) {
      const dir = state.order === "desc" ? -1 : 1;
      rows.sort((a, b) => {
        const va = value(name, key, a);
        const vb = value(name, key, b);
        const none = (v) => v === null || v === undefined;
        if (none(va) || none(vb)) return Number(none(va)) - Number(none(vb)); // none last
        return (va - vb) * dir;
      });
    }
  }
  const groupHead = [h("th", { rowspan: "2" }, "job")];
  const colHead = [];
  const columns = [];
  for (const m of metrics) {
    const cols = metricColumns(m, data.last);
    groupHead.push(h("th", { colspan: String(cols.length), class: "metric-head", "data-metric": m.name,
      title: m.goal ? `${m.goal === "min" ? "lower" : "higher"} is better (from ${m.goal_from})` : "goal not known: min and max shown",
      testid: "numbers-metric" }, m.name, m.goal ? ` ${ARROW[m.goal]}` : ""));
    for (const c of cols) {
      const sortKey = `${m.name}\u0000${c.key}`;
      const active = state.sort === sortKey;
      const present = ids.map((id) => value(m.name, c.key, id)).filter((v) => v !== null && v !== undefined);
      const differs = new Set(present).size > 1 || (present.length > 0 && present.length < ids.length);
      const top = c.better && present.length ? (c.better === "min" ? Math.min(...present) : Math.max(...present)) : null;
      columns.push({ m, c, differs, top });
      colHead.push(h("th", {
        class: `num sortable${active ? " sorted" : ""}${differs ? " differs" : ""}`,
        title: c.title, testid: "numbers-sort", "data-metric": m.name, "data-key": c.key,
        "aria-sort": active ? (state.order === "desc" ? "descending" : "ascending") : "none",
        onclick: () => {
          state.order = active && state.order === "asc" ? "desc" : "asc";
          state.sort = sortKey;
          onsort();
        },
      }, c.label, active ? (state.order === "desc" ? " ▾" : " ▴") : ""));
    }
  }
  const body = rows.map((id) => h("tr", { testid: "numbers-row", "data-job-id": id },
    h("th", {}, h("span", { class: "swatch", style: `background:${colors.get(id) || "#888"}` }),
      h("a", { href: `#/jobs/${id}` }, `#${id}`), jobs.get(id) ? ` ${jobs.get(id).name}` : ""),
    columns.map(({ m, c, differs, top }) => {
      const v = value(m.name, c.key, id);
      const r = cells.get(m.name).get(id);
      const best = top !== null && v === top && differs;
      const title = r && c.key === "final" ? `at step ${r.final_step}`
        : r && c.key === "last_mean" ? `mean of ${r.last_count} value(s)` : null;
      return h("td", { class: `num mono${differs ? " differs" : ""}${best ? " best" : ""}`, "data-metric": m.name,
        "data-key": c.key, "data-value": v === null || v === undefined ? "" : String(v), title }, fmtNum(v));
    })));
  return h("div", { class: "table-wrap" }, h("table", { class: "grid compact numbers", testid: "compare-numbers" },
    h("thead", {}, h("tr", {}, groupHead), h("tr", {}, colHead)), h("tbody", {}, body)));
}
