// The compare page (#/compare?ids=1,2): a metric of several jobs on one chart, one legend for
// all the charts (a click hides or shows a job), the x axis by step, time since each run's
// start, or another logged metric (paired by step), and the jobs' numbers (comparetable.js).
import { hparamsTable } from "./runs.js";
import { jobState } from "./search.js";
import { ChartGrid, MetricSeries, chartControls } from "./charts.js";
import { numbersTable } from "./comparetable.js";
import {
  ApiError,
  PALETTE,
  POLL_MS,
  TERMINAL,
  api,
  badge,
  debounce,
  h,
  metricsText,
} from "./core.js";

const DEFAULT_LAST = 10;
const TIME_UNITS = [[7200, 3600, "h"], [120, 60, "min"], [0, 1, "s"]]; // [past, seconds, name]

/** When a run started: the job's first start, or else its first point's wall time. */
function startOf(job, s) {
  if (job && job.started_at) return job.started_at;
  let first = null;
  for (const series of s.metrics.series.values()) {
    if (series.t.length && (first === null || series.t[0] < first)) first = series.t[0];
  }
  return first;
}

/** The points of `ys` with, as x, the value `xs` (another series of the run) has at the same
 * step, or the last one it logged before it; points before its first are left out. */
export function pairByStep(ys, xs) {
  const out = { x: [], y: [] };
  let j = -1;
  for (let i = 0; i < ys.x.length; i += 1) {
    while (j + 1 < xs.x.length && xs.x[j + 1] <= ys.x[i]) j += 1;
    if (j < 0 || xs.y[j] === null || xs.y[j] === undefined) continue;
    out.x.push(xs.y[j]);
    out.y.push(ys.y[i]);
  }
  return out;
}

/** Where each attempt after the first started, on the chart's x axis: its start time (since
 * the run's, in `unit` seconds), or the first step the series logged from then on. */
function restarts(job, series, time, color, id) {
  const out = [];
  for (const a of (job && job.attempt_history) || []) {
    if (a.number < 2) continue;
    const label = `#${id} attempt ${a.number}`;
    if (time) {
      out.push({ x: (a.started_at - time.start) / time.unit, label, color });
      continue;
    }
    const i = series.t.findIndex((w) => w >= a.started_at);
    if (i >= 0) out.push({ x: series.x[i], label, color });
  }
  return out;
}

export function comparePage(view, query) {
  const ids = [...new Set((query.get("ids") || "").split(",").map((s) => Number(s.trim())).filter((n) => Number.isInteger(n) && n > 0))];
  const chosen = new Set(ids);
  const metricWanted = query.get("metric") || "";
  const chartOpts = { smoothing: Number(query.get("smoothing")) || 0, log: query.get("log") === "1" };
  const xWanted = query.get("x") || "step"; // step, wall, or metric:NAME
  const lastWanted = Number(query.get("last"));
  const last = Number.isInteger(lastWanted) && lastWanted >= 1 && lastWanted <= 100000 ? lastWanted : DEFAULT_LAST;
  const xSel = h("select", { testid: "compare-x", "aria-label": "x axis", onchange: () => apply() },
    h("option", { value: "step" }, "x: step"), h("option", { value: "wall" }, "x: time since start"));
  xSel.value = xWanted === "wall" ? "wall" : "step";
  const lastInput = h("input", { type: "number", min: "1", max: "100000", step: "1", value: String(last),
    testid: "compare-last", "aria-label": "points in the last-N mean", class: "narrow",
    onchange: () => apply() });
  const grid = h("div", { class: "charts wide", testid: "compare-charts" });
  const charts = new ChartGrid(grid, "compare-chart-", chartOpts);
  const sources = new Map(ids.map((id) => [id, { job: null, metrics: new MetricSeries(id), error: null }]));
  const colors = new Map(ids.map((id, i) => [id, PALETTE[i % PALETTE.length]]));
  const hidden = new Set(); // jobs the legend hides on every chart
  const legend = h("ul", { class: "compare-legend", testid: "compare-jobs" });
  const metricSel = h("select", { testid: "compare-metric", "aria-label": "metric",
    onchange: () => apply() }, h("option", { value: "" }, "all metrics"));
  const idsInput = h("input", { type: "text", value: ids.join(","), placeholder: "job ids, e.g. 3,5,8", testid: "compare-ids",
    "aria-label": "job ids", onkeydown: (e) => { if (e.key === "Enter") apply(true); } });
  const note = h("p", { class: "muted", testid: "compare-note" }, "");
  const hpBox = h("div", { testid: "compare-hparams-box" });
  const numbersBox = h("div", { testid: "compare-numbers-box" });
  const numbersState = { sort: "", order: "asc", data: null, error: null };
  let hpShown = "";

  function apply(fromInput = false) {
    const list = fromInput
      ? idsInput.value.split(/[ ,]+/).map(Number).filter((n) => Number.isInteger(n) && n > 0)
      : [...chosen];
    const p = new URLSearchParams();
    if (list.length) p.set("ids", list.join(","));
    if (metricSel.value) p.set("metric", metricSel.value);
    if (xSel.value !== "step") p.set("x", xSel.value);
    const n = Number(lastInput.value);
    if (Number.isInteger(n) && n >= 1 && n !== DEFAULT_LAST) p.set("last", String(Math.min(n, 100000)));
    location.hash = `#/compare${p.toString() ? `?${p}` : ""}`.replaceAll("%2C", ",");
  }

  const drawNumbers = () => {
    const { data, error } = numbersState;
    if (error) {
      numbersBox.replaceChildren(h("p", { class: "error", testid: "compare-numbers" }, error));
      return;
    }
    if (!data) return;
    const jobs = new Map([...sources].filter(([, s]) => s.job).map(([id, s]) => [id, s.job]));
    const names = metricWanted && data.metrics.some((m) => m.name === metricWanted) ? new Set([metricWanted]) : null;
    numbersBox.replaceChildren(numbersTable(data, { names, state: numbersState, jobs, colors, onsort: drawNumbers }));
  };

  /** The x axis: {kind: "step"} | {kind: "wall", unit, name} | {kind: "metric", name}. */
  const xAxis = () => {
    if (xWanted.startsWith("metric:")) return { kind: "metric", name: xWanted.slice("metric:".length) };
    if (xWanted !== "wall") return { kind: "step" };
    let longest = 0;
    for (const [, s] of sources) {
      const start = startOf(s.job, s);
      if (start === null) continue;
      for (const series of s.metrics.series.values()) {
        if (series.t.length) longest = Math.max(longest, series.t[series.t.length - 1] - start);
      }
    }
    const [, unit, name] = TIME_UNITS.find(([past]) => longest > past);
    return { kind: "wall", unit, name };
  };

  const draw = () => {
    const names = new Set();
    for (const s of sources.values()) for (const n of s.metrics.series.keys()) names.add(n);
    const known = [...names].sort();
    if (metricSel.options.length - 1 !== known.length) {
      metricSel.replaceChildren(h("option", { value: "" }, "all metrics"), ...known.map((n) => h("option", { value: n }, n)));
      metricSel.value = names.has(metricWanted) ? metricWanted : "";
    }
    // x: any logged metric too
    const xOptions = known.map((n) => `metric:${n}`);
    if (xSel.options.length - 2 !== xOptions.length) {
      xSel.replaceChildren(h("option", { value: "step" }, "x: step"), h("option", { value: "wall" }, "x: time since start"),
        ...known.map((n) => h("option", { value: `metric:${n}` }, `x: ${n}`)));
      xSel.value = xWanted === "wall" || xOptions.includes(xWanted) ? xWanted : "step";
    }
    const x = xAxis();
    const shown = (metricWanted && names.has(metricWanted) ? [metricWanted] : known)
      .filter((n) => x.kind !== "metric" || n !== x.name); // not itself against itself
    for (const name of shown) {
      const traces = [];
      const marks = [];
      for (const [id, s] of sources) {
        const series = s.metrics.series.get(name);
        const color = colors.get(id);
        if (!series || hidden.has(id)) continue;
        const label = `#${id} ${s.job ? s.job.name : ""}`.trim();
        if (x.kind === "metric") {
          const against = s.metrics.series.get(x.name);
          if (against) traces.push({ name: label, ...pairByStep(series, against), color });
          continue;
        }
        let xs = series.x;
        let time = null;
        if (x.kind === "wall") {
          const start = startOf(s.job, s);
          time = { start, unit: x.unit };
          xs = series.t.map((w) => (w - start) / x.unit);
        }
        traces.push({ name: label, x: xs, y: series.y, color });
        marks.push(...restarts(s.job, series, time, color, id));
      }
      const xTitle = x.kind === "metric" ? x.name : x.kind === "wall" ? `time since start (${x.name})` : "step";
      charts.axes = { xTitle, marks, legend: false };
      charts.set(name, name, traces);
    }
    charts.keep(new Set(shown));
    legend.replaceChildren(...[...sources].map(([id, s]) => {
      const off = hidden.has(id);
      return h("li", { class: off ? "off" : "", testid: "compare-legend-item", "data-job-id": id },
        h("button", { type: "button", class: "legend-toggle", "aria-pressed": String(!off), testid: "compare-legend-toggle",
          title: off ? "Show this job on the charts" : "Hide this job on the charts",
          onclick: () => {
            if (hidden.has(id)) hidden.delete(id);
            else hidden.add(id);
            draw();
          } }, h("span", { class: "swatch", style: `background:${colors.get(id)}` })),
        h("a", { href: `#/jobs/${id}` }, `#${id} ${s.job ? s.job.name : ""}`), " ",
        s.job ? badge(jobState(s.job)) : null,
        s.error ? h("span", { class: "error" }, ` ${s.error}`) : null);
    }));
    const jobs = [...sources.values()].map((s) => s.job).filter(Boolean);
    const hpKey = JSON.stringify(jobs.map((j) => [j.id, j.hparams, j.spec && j.spec.hparams]));
    if (hpKey !== hpShown) {
      hpShown = hpKey;
      hpBox.replaceChildren(jobs.length ? hparamsTable(jobs) : "");
      drawNumbers(); // with the jobs' names
    }
    note.textContent = !ids.length ? "Pick jobs below (or type their ids) to overlay their metrics."
      : names.size ? "" : "None of these jobs has reported metrics yet.";
  };

  if (ids.length) {
    let numbersFinal = false; // read after every job ended: not read again
    view.poll(async () => {
      let busy = false;
      for (const [id, s] of sources) {
        try {
          if (!s.job || !TERMINAL.has(s.job.state)) s.job = await api(`/jobs/${id}`);
          await s.metrics.update(s.job);
          if (!s.metrics.complete) busy = true;
        } catch (err) {
          if (!(err instanceof ApiError)) throw err;
          s.error = err.message;
        }
      }
      const readable = ids.filter((id) => !sources.get(id).error); // the others say why in the legend
      if (!numbersFinal && readable.length) {
        const ended = readable.every((id) => TERMINAL.has(sources.get(id).job.state));
        try {
          numbersState.data = await api(`/runs/compare?ids=${readable.join(",")}&last=${last}`);
          numbersState.error = null;
          numbersFinal = ended;
        } catch (err) {
          if (!(err instanceof ApiError)) throw err;
          numbersState.error = err.message;
          numbersFinal = true;
        }
        drawNumbers();
      }
      draw();
      return busy || (!numbersFinal && readable.length > 0);
    }, POLL_MS * 1.5);
  } else {
    draw();
  }

  // the picker: recent jobs with checkboxes
  const pickRows = h("tbody");
  const pickName = h("input", { type: "search", placeholder: "name contains…", "aria-label": "filter by name",
    oninput: debounce(() => picker.now(), 250) });
  const picker = view.poll(async () => {
    const p = new URLSearchParams({ all: "true", limit: "50" });
    if (pickName.value.trim()) p.set("name", pickName.value.trim());
    const data = await api(`/jobs?${p}`);
    pickRows.replaceChildren(...data.jobs.map((j) => {
      const box = h("input", { type: "checkbox", checked: chosen.has(j.id), "data-job-id": j.id,
        onchange: () => {
          if (box.checked) chosen.add(j.id);
          else chosen.delete(j.id);
          idsInput.value = [...chosen].join(",");
        } });
      return h("tr", { testid: "compare-pick-row" }, h("td", {}, box), h("td", { class: "num" }, String(j.id)),
        h("td", {}, j.name), h("td", {}, j.owner), h("td", {}, badge(jobState(j))), h("td", {}, metricsText(j.latest_metrics)));
    }));
    return false; // read once (and again when the name filter changes)
  }, POLL_MS);

  return h("section", { class: "page compare" },
    h("div", { class: "toolbar" }, h("h1", {}, "Compare"), h("span", { class: "spacer" }),
      idsInput, h("button", { testid: "compare-apply", onclick: () => apply(true) }, "Compare"), metricSel),
    h("section", { class: "card" },
      h("div", { class: "card-head" }, legend, h("span", { class: "spacer" }), xSel, chartControls(chartOpts, () => charts.redraw(), "compare-")),
      note, h("div", { class: "compare-body" }, grid, hpBox)),
    ids.length ? h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", {}, "Numbers"), h("span", { class: "spacer" }),
        h("label", { title: "The mean is of each series' last N points" }, "mean of the last ", lastInput, " points")),
      numbersBox) : null,
    h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", {}, "Pick jobs"), pickName),
      h("div", { class: "table-wrap" }, h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["", "ID", "Name", "Owner", "State", "Latest metrics"].map((c) => h("th", {}, c)))),
        pickRows))));
}
