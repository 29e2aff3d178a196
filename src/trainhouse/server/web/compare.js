// The compare page (#/compare?ids=1,2): a metric of several jobs on one chart.
import { hparamsTable } from "./runs.js";
import { jobState } from "./search.js";
import { ChartGrid, MetricSeries, chartControls } from "./charts.js";
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

/** Where each attempt after the first started, on the chart's x axis: its start time, or the
 * first step the series logged from then on. */
function restarts(job, series, byWall, color, id) {
  const out = [];
  for (const a of (job && job.attempt_history) || []) {
    if (a.number < 2) continue;
    const label = `#${id} attempt ${a.number}`;
    if (byWall) {
      out.push({ x: new Date(a.started_at * 1000), label, color });
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
  const byWall = query.get("x") === "wall";
  const xSel = h("select", { testid: "compare-x", "aria-label": "x axis", onchange: () => apply() },
    h("option", { value: "step" }, "x: step"), h("option", { value: "wall" }, "x: wall time"));
  xSel.value = byWall ? "wall" : "step";
  const grid = h("div", { class: "charts wide", testid: "compare-charts" });
  const charts = new ChartGrid(grid, "compare-chart-", chartOpts);
  const sources = new Map(ids.map((id) => [id, { job: null, metrics: new MetricSeries(id), error: null }]));
  const legend = h("ul", { class: "compare-legend", testid: "compare-jobs" });
  const metricSel = h("select", { testid: "compare-metric", "aria-label": "metric",
    onchange: () => apply() }, h("option", { value: "" }, "all metrics"));
  const idsInput = h("input", { type: "text", value: ids.join(","), placeholder: "job ids, e.g. 3,5,8", testid: "compare-ids",
    "aria-label": "job ids", onkeydown: (e) => { if (e.key === "Enter") apply(true); } });
  const note = h("p", { class: "muted", testid: "compare-note" }, "");
  const hpBox = h("div", { testid: "compare-hparams-box" });
  let hpShown = "";

  function apply(fromInput = false) {
    const list = fromInput
      ? idsInput.value.split(/[ ,]+/).map(Number).filter((n) => Number.isInteger(n) && n > 0)
      : [...chosen];
    const p = new URLSearchParams();
    if (list.length) p.set("ids", list.join(","));
    if (metricSel.value) p.set("metric", metricSel.value);
    if (xSel.value === "wall") p.set("x", "wall");
    location.hash = `#/compare${p.toString() ? `?${p}` : ""}`.replaceAll("%2C", ",");
  }

  const draw = () => {
    const names = new Set();
    for (const s of sources.values()) for (const n of s.metrics.series.keys()) names.add(n);
    const known = [...names].sort();
    if (metricSel.options.length - 1 !== known.length) {
      metricSel.replaceChildren(h("option", { value: "" }, "all metrics"), ...known.map((n) => h("option", { value: n }, n)));
      metricSel.value = names.has(metricWanted) ? metricWanted : "";
    }
    const shown = metricWanted && names.has(metricWanted) ? [metricWanted] : known;
    for (const name of shown) {
      const traces = [];
      const marks = [];
      [...sources].forEach(([id, s], i) => {
        const series = s.metrics.series.get(name);
        const color = PALETTE[i % PALETTE.length];
        if (!series) return;
        const x = byWall ? series.t.map((w) => new Date(w * 1000)) : series.x;
        traces.push({ name: `#${id} ${s.job ? s.job.name : ""}`.trim(), x, y: series.y, color });
        marks.push(...restarts(s.job, series, byWall, color, id));
      });
      charts.axes = byWall ? { xType: "date", xTitle: "wall time", marks } : { xTitle: "step", marks };
      charts.set(name, name, traces);
    }
    charts.keep(new Set(shown));
    legend.replaceChildren(...[...sources].map(([id, s], i) => h("li", {},
      h("span", { class: "swatch", style: `background:${PALETTE[i % PALETTE.length]}` }),
      h("a", { href: `#/jobs/${id}` }, `#${id} ${s.job ? s.job.name : ""}`), " ",
      s.job ? badge(jobState(s.job)) : null,
      s.error ? h("span", { class: "error" }, ` ${s.error}`) : null)));
    const jobs = [...sources.values()].map((s) => s.job).filter(Boolean);
    const hpKey = JSON.stringify(jobs.map((j) => [j.id, j.hparams, j.spec && j.spec.hparams]));
    if (hpKey !== hpShown) {
      hpShown = hpKey;
      hpBox.replaceChildren(jobs.length ? hparamsTable(jobs) : "");
    }
    note.textContent = !ids.length ? "Pick jobs below (or type their ids) to overlay their metrics."
      : names.size ? "" : "None of these jobs has reported metrics yet.";
  };

  if (ids.length) {
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
      draw();
      return busy;
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
    h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", {}, "Pick jobs"), pickName),
      h("div", { class: "table-wrap" }, h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["", "ID", "Name", "Owner", "State", "Latest metrics"].map((c) => h("th", {}, c)))),
        pickRows))));
}
