// Hyperparameter searches: the list (#/searches) and a search's page (#/searches/<id>): its
// trials (sortable), best-so-far over trials, each trial's objective curve (pruned ones
// marked), parallel coordinates of hparams against the objective (a log_uniform hparam on a log
// axis), and hparam importances; Cancel (its owner and admins, asked first) and a link that
// compares its trials' jobs.
import { PALETTE, POLL_MS, api, fmtDuration, fmtNum, h, kv, timeCell } from "./core.js";
import { drawChart, pageColors, plotlyText } from "./charts.js";

const TRIAL_STATES = ["QUEUED", "RUNNING", "COMPLETED", "PRUNED", "FAILED"];

/** A job's state as lists show it (the job list, the compare page): PRUNED for a search's
 * trial its pruner stopped (the job itself is COMPLETED: it ended early on purpose), else its
 * state. */
export function jobState(job) {
  return job.state === "COMPLETED" && job.prune_requested ? "PRUNED" : job.state;
}

function countsText(counts) {
  return TRIAL_STATES.map((s) => `${(counts || {})[s] || 0} ${s.toLowerCase()}`).join(" · ");
}

export function searchesPage(view) {
  const tbody = h("tbody", { testid: "search-rows" });
  view.poll(async () => {
    const data = await api("/searches?all=true");
    if (!view.alive) return;
    tbody.replaceChildren(...(data.searches.length ? data.searches.map((s) =>
      h("tr", { testid: "search-row", "data-search-id": s.id },
        h("td", { class: "num" }, h("a", { href: `#/searches/${s.id}` }, String(s.id))),
        h("td", {}, h("a", { href: `#/searches/${s.id}` }, s.name)),
        h("td", {}, s.owner),
        h("td", {}, h("span", { class: `badge state-${s.state}` }, s.state)),
        h("td", {}, `${s.method} + ${s.early_stopping}`),
        h("td", {}, `${s.mode} ${s.metric}`),
        h("td", { class: "wrap" }, countsText(s.trial_counts)),
        h("td", {}, timeCell(s.created_at))))
      : [h("tr", { class: "empty" }, h("td", { colspan: "8" },
        "No searches yet. Submit a spec with a search: block: trainhouse submit search.yaml"))]));
  }, POLL_MS);
  return h("section", { class: "page searches" },
    h("div", { class: "toolbar" }, h("h1", {}, "Searches")),
    // in a card as the other lists; the trial counts wrap, so Submitted stays in view at 1000 px
    h("section", { class: "card" }, h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "searches-table" },
      h("thead", {}, h("tr", {}, ["ID", "Name", "Owner", "State", "Method", "Objective", "Trials", "Submitted"]
        .map((c) => h("th", {}, c)))), tbody))));
}

/** The trials' rows sorted by one column (numbers as numbers, nulls last). */
function sortTrials(trials, key, order) {
  const value = (t) => (key.startsWith("param:") ? t.params[key.slice(6)] : t[key]);
  const dir = order === "asc" ? 1 : -1;
  return [...trials].sort((a, b) => {
    const x = value(a);
    const y = value(b);
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    if (typeof x === "number" && typeof y === "number") return (x - y) * dir || a.number - b.number;
    return String(x).localeCompare(String(y)) * dir || a.number - b.number;
  });
}

function bestSoFar(view) {
  const ended = view.trials.filter((t) => t.state === "COMPLETED" && t.value !== null)
    .sort((a, b) => a.number - b.number);
  const pick = view.mode === "min" ? Math.min : Math.max;
  let best = null;
  const x = [];
  const y = [];
  for (const t of ended) {
    best = best === null ? t.value : pick(best, t.value);
    x.push(t.number);
    y.push(best);
  }
  return { x, y, values: ended.map((t) => t.value), numbers: ended.map((t) => t.number) };
}

function drawCurves(el, curves, metric) {
  if (!window.Plotly) {
    el.textContent = "the chart library (plotly.js) did not load";
    return;
  }
  const data = curves.filter((c) => c.steps.length).map((c, i) => {
    const pruned = c.state === "PRUNED";
    return {
      type: "scatter",
      mode: "lines+markers",
      name: plotlyText(`trial ${c.number}${pruned ? " (pruned)" : ""}`),
      x: c.steps,
      y: c.values,
      pruned,
      line: { color: pruned ? "#9aa0a6" : PALETTE[i % PALETTE.length], width: 1.4, dash: pruned ? "dot" : "solid" },
      // a pruned trial's last reported point: where the pruner stopped it; a trial that reported
      // once has no line to draw, so its one point is a dot
      marker: pruned
        ? { size: c.steps.map((_, k) => (k === c.steps.length - 1 ? 9 : 0)), symbol: "x", color: "#e4572e" }
        : { size: c.steps.length === 1 ? 7 : 0, color: PALETTE[i % PALETTE.length] },
    };
  });
  const { ink, grid } = pageColors(); // in the dark scheme too
  window.Plotly.react(el, data, {
    font: { color: ink },
    title: { text: plotlyText(`${metric} by step (pruned trials dotted, x where stopped)`), font: { size: 13 }, x: 0.01, xanchor: "left" },
    height: 300, margin: { l: 56, r: 14, t: 40, b: 40 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    showlegend: data.length <= 20, xaxis: { title: { text: "step" }, gridcolor: grid }, yaxis: { gridcolor: grid },
    uirevision: "curves",
  }, { responsive: true, displaylogo: false });
}

/** The dotted names of the spec's hparams sampled on a log scale ({log_uniform: [low, high]}). */
export function logScaled(hparams, prefix = "") {
  const found = new Set();
  for (const [key, value] of Object.entries(hparams || {})) {
    if (!value || typeof value !== "object" || Array.isArray(value)) continue;
    if (Array.isArray(value.log_uniform)) found.add(prefix + key);
    else for (const inner of logScaled(value, `${prefix}${key}.`)) found.add(inner);
  }
  return found;
}

/** A parallel-coordinates axis of positive values on a log scale: Plotly's parcoords has no
 * log axis, so the values are log10 and the ticks (each power of ten in range) say the values. */
function logAxis(label, vals) {
  const logs = vals.map((v) => Math.log10(v));
  const lo = Math.floor(Math.min(...logs));
  const hi = Math.ceil(Math.max(...logs));
  const ticks = [];
  for (let e = lo; e <= hi; e += 1) ticks.push(e);
  return { label: plotlyText(`${label} (log)`), values: logs, tickvals: ticks,
    ticktext: ticks.map((e) => (Math.abs(e) <= 4 ? String(Number(`1e${e}`)) : `1e${e}`)),
    range: [lo, hi] };
}

function drawParallel(el, view) {
  if (!window.Plotly) return;
  const rows = view.trials.filter((t) => t.value !== null || t.latest !== null);
  const names = [...new Set(view.trials.flatMap((t) => Object.keys(t.params)))].sort();
  const logs = logScaled((view.spec || {}).hparams);
  const dims = names.map((name) => {
    const vals = rows.map((t) => t.params[name]);
    if (logs.has(name) && vals.length && vals.every((v) => typeof v === "number" && v > 0)) return logAxis(name, vals);
    if (vals.every((v) => typeof v === "number")) return { label: plotlyText(name), values: vals };
    const cats = [...new Set(vals.map(String))].sort();
    return { label: plotlyText(name), values: vals.map((v) => cats.indexOf(String(v))), tickvals: cats.map((_, i) => i), ticktext: cats.map(plotlyText) };
  });
  const objective = rows.map((t) => (t.value !== null ? t.value : t.latest));
  dims.push({ label: plotlyText(view.metric), values: objective });
  window.Plotly.react(el, [{
    type: "parcoords",
    dimensions: dims,
    line: { color: objective, colorscale: "Viridis", reversescale: view.mode === "min", showscale: true },
  }], { height: 300, margin: { l: 60, r: 60, t: 40, b: 24 }, paper_bgcolor: "rgba(0,0,0,0)", font: { color: pageColors().ink } },
  { responsive: true, displaylogo: false });
}

export function searchPage(view, id) {
  const head = h("div", { class: "toolbar" }, h("h1", {}, `Search ${id}`));
  const facts = h("dl", { class: "summary", testid: "search-facts" });
  const warning = h("p", { class: "error", testid: "search-warning", hidden: true });
  const st = { sort: "number", order: "asc" };
  const thead = h("tr");
  const tbody = h("tbody", { testid: "trial-rows" });
  const best = h("div", { class: "chart", testid: "chart-best" });
  const curves = h("div", { class: "chart", testid: "chart-curves" });
  const parallel = h("div", { class: "chart", testid: "chart-parallel" });
  const importances = h("div", { class: "chart", testid: "chart-importances" });
  let last = null;
  let me = null;

  // "compare these trials": the trials' jobs on the compare page (its table, curves, x axis)
  const compareLink = h("a", { class: "button", testid: "search-compare", hidden: true }, "Compare these trials");
  // Cancel: its owner and admins (anyone, auth off); viewers never see it; asked first
  const message = h("span", { class: "muted", testid: "search-cancel-message" }, "");
  const cancelBtn = h("button", { class: "danger", testid: "search-cancel", hidden: true,
    onclick: () => { dialog.hidden = false; cancelBtn.hidden = true; } }, "Cancel search");
  const dialog = h("span", { class: "confirm", testid: "search-cancel-dialog", hidden: true },
    `Cancel search ${id}? No new trials start; its running trials are canceled.`,
    h("button", { class: "danger", testid: "search-cancel-confirm", onclick: () => doCancel() }, "Yes, cancel it"),
    h("button", { testid: "search-cancel-abort", onclick: () => { dialog.hidden = true; actions(); } }, "Keep searching"));
  const mayCancel = (s) => Boolean(me) && (me.role === "open" || me.role === "admin" ||
    (me.role === "member" && me.name === s.owner));

  function actions() {
    if (!last) return;
    const ids = last.trials.map((t) => t.job_id);
    compareLink.hidden = !ids.length;
    compareLink.setAttribute("href", `#/compare?ids=${ids.join(",")}`);
    const running = last.state === "RUNNING";
    if (!running) dialog.hidden = true;
    cancelBtn.hidden = !running || !mayCancel(last) || !dialog.hidden;
  }

  async function doCancel() {
    dialog.hidden = true;
    message.textContent = "canceling…";
    try {
      await api(`/searches/${id}/cancel`, { method: "POST" });
      message.textContent = "";
    } catch (err) {
      message.textContent = `cancel refused: ${err.message}`;
    }
    actions();
    view.wake();
  }

  const render = () => {
    if (!last) return;
    const names = [...new Set(last.trials.flatMap((t) => Object.keys(t.params)))].sort();
    const cols = [["number", "Trial"], ["job_id", "Job"], ["state", "State"],
      ...names.map((n) => [`param:${n}`, n]), ["value", "Objective"], ["latest", "Latest"],
      ["best", "Best"], ["last_step", "Step"], ["duration", "Duration"]];
    thead.replaceChildren(...cols.map(([key, label]) => {
      const active = st.sort === key;
      // an hparam's name as written (case matters), not upper-cased as the other heads
      const param = key.startsWith("param:") ? " as-written" : "";
      return h("th", { class: `sortable${active ? " sorted" : ""}${param}`, testid: `trial-sort-${key}`,
        "aria-sort": active ? (st.order === "asc" ? "ascending" : "descending") : "none",
        onclick: () => {
          if (st.sort === key) st.order = st.order === "asc" ? "desc" : "asc";
          else { st.sort = key; st.order = "asc"; }
          render();
        } }, label, h("span", { class: "arrow" }, active ? (st.order === "asc" ? " ▲" : " ▼") : ""));
    }));
    tbody.replaceChildren(...sortTrials(last.trials, st.sort, st.order).map((t) =>
      h("tr", { testid: "trial-row", "data-trial": t.number, "data-state": t.state, title: t.reason || "" },
        h("td", { class: "num" }, String(t.number)),
        h("td", { class: "num" }, h("a", { href: `#/jobs/${t.job_id}` }, String(t.job_id))),
        h("td", {}, h("span", { class: `badge state-${t.state}` }, t.state)),
        names.map((n) => h("td", { class: "num" }, t.params[n] === undefined ? "" : fmtNum(t.params[n]))),
        h("td", { class: "num", testid: "trial-value" }, t.value === null ? "" : fmtNum(t.value)),
        h("td", { class: "num", testid: "trial-latest" }, t.latest === null ? "—" : fmtNum(t.latest)),
        h("td", { class: "num", testid: "trial-best" }, t.best === null ? "—" : fmtNum(t.best)),
        h("td", { class: "num" }, t.last_step === null ? "" : String(t.last_step)),
        h("td", { class: "num" }, t.duration === null ? "" : fmtDuration(t.duration)))));
  };

  view.poll(async () => {
    const [data, curveData, imp, who] = await Promise.all([
      api(`/searches/${id}`), api(`/searches/${id}/curves`), api(`/searches/${id}/importances`),
      me ? Promise.resolve(me) : api("/whoami")]);
    if (!view.alive) return false;
    last = data;
    me = who;
    document.title = `${data.name} · search ${id} · trainhouse`;
    head.replaceChildren(h("h1", {}, `Search ${id}: ${data.name}`),
      h("span", { class: `badge state-${data.state}`, testid: "search-state" }, data.state),
      h("span", { class: "actions" }, compareLink, cancelBtn, dialog, message));
    actions();
    const top = data.best;
    facts.replaceChildren(
      ...kv("method", `${data.method} + ${data.early_stopping}`),
      ...kv("objective", `${data.mode} ${data.metric}`),
      ...kv("trials", `${countsText(data.trial_counts)} (of ${data.max_trials}, ${data.max_concurrent} at once)`, "search-counts"),
      ...kv("best", top ? `trial ${top.number} (job ${top.job_id}): ${fmtNum(top.value)}` : "none yet", "search-best"),
      ...kv("state", data.reason || data.state));
    warning.hidden = !data.warning;
    warning.textContent = data.warning || "";
    render();
    const so = bestSoFar(data);
    drawChart(best, `best ${data.metric} so far`, [
      { name: "best so far", x: so.x, y: so.y },
      { name: "trial value", x: so.numbers, y: so.values, color: "#9aa0a6" },
    ], { xTitle: "trial" });
    drawCurves(curves, curveData.trials, data.metric);
    drawParallel(parallel, data);
    if (imp.importances && window.Plotly) {
      const entries = Object.entries(imp.importances);
      importances.classList.remove("chart-note");
      window.Plotly.react(importances, [{ type: "bar", orientation: "h", x: entries.map((e) => e[1]),
        y: entries.map((e) => plotlyText(e[0])) }],
      { title: { text: "hparam importances (Optuna)", font: { size: 13 } }, height: 220, font: { color: pageColors().ink },
        margin: { l: 100, r: 14, t: 36, b: 30 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)" },
      { responsive: true, displaylogo: false });
    } else {
      importances.classList.add("chart-note");
      importances.textContent = `hparam importances appear once ${imp.needed} trials have completed (${imp.completed} so far)`;
    }
    return data.state === "RUNNING" || (data.trial_counts.RUNNING || 0) > 0;
  }, POLL_MS);

  // the facts and the trials in cards, as a job's page has its summary
  return h("section", { class: "page search" }, head, h("section", { class: "card" }, facts), warning,
    h("section", { class: "card" },
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "trials-table" }, h("thead", {}, thead), tbody))),
    h("div", { class: "charts" }, best, curves, parallel, importances));
}
