// Charts (plotly.js): drawing, smoothing, a page's chart grid, and the series behind them.
import { FULL_REFETCH_MS, MAX_POINTS, PALETTE, TERMINAL, api, h } from "./core.js";

/** TensorBoard's smoothing: an exponential moving average, debiased at the start. */
export function ema(ys, weight) {
  let last = 0;
  let n = 0;
  return ys.map((y) => {
    if (y === null || y === undefined || !Number.isFinite(y)) return null;
    last = last * weight + (1 - weight) * y;
    n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}

/**
 * text as plotly shows it literally. Plotly reads tags and entities in titles, legends and hover
 * labels (<a href> becomes a link, <b> bold, <br> a break); names come from jobs (a metric's
 * name is whatever a script logged), so every one is escaped: plotly turns &lt; &gt; &amp;
 * back into the characters, as text.
 */
export function plotlyText(text) {
  return String(text).replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;");
}

/** The page's (light or dark) text, grid, muted and accent colours, for a chart drawn on it. */
export function pageColors() {
  const css = getComputedStyle(document.documentElement);
  return {
    ink: css.getPropertyValue("--ink").trim() || "#1d2433",
    grid: css.getPropertyValue("--line").trim() || "#e2e5eb",
    muted: css.getPropertyValue("--muted").trim() || "#6b7385",
    accent: css.getPropertyValue("--accent").trim() || "#2b59c3",
  };
}

/**
 * Draws traces [{name, x, y}] into el. data[i] are the raw series in order; smoothed copies
 * (when opts.smoothing > 0) follow them, so el.data[0].x/y is always the first raw series.
 * The title, the traces' names and their hover texts are plain text (plotlyText).
 * A trace may also say how it is drawn: mode ("lines", "markers"), shape (a line's: "hv" for
 * steps), text (a hover text per point), symbol (its markers'). opts.yaxis adds to the y axis
 * (a title, integer ticks); opts.marks are dashed vertical lines, each labelled.
 */

export function drawChart(el, title, traces, opts) {
  if (!window.Plotly) {
    el.textContent = `${title}: the chart library (plotly.js) did not load`;
    el.classList.add("chart-missing");
    return;
  }
  const smoothing = opts.smoothing || 0;
  // a chart of several traces has its own legend, unless the page has one for all its charts
  const multi = traces.length > 1 && opts.legend !== false;
  // Plotly.react sees a data array as changed only when it is a new array: a live series
  // grows in place (MetricSeries pushes the points it polls), so each draw hands plotly
  // copies, or the chart and its axes would stay as first drawn until the next full read
  const data = traces.map((t, i) => ({
    type: t.x.length > 20000 ? "scattergl" : "scatter",
    mode: t.mode || (t.x.length === 1 ? "markers" : "lines"),
    name: plotlyText(t.name),
    x: t.x.slice(),
    y: t.y.slice(),
    ...(t.text ? { text: t.text.map((s) => (s === null || s === undefined ? "" : plotlyText(s))) } : {}),
    legendgroup: t.name,
    showlegend: multi && smoothing === 0,
    opacity: smoothing > 0 ? 0.28 : 1,
    line: { color: t.color || PALETTE[i % PALETTE.length], width: smoothing > 0 ? 1 : 1.6, ...(t.shape ? { shape: t.shape } : {}) },
    marker: { color: t.color || PALETTE[i % PALETTE.length], size: t.symbol ? 9 : 5, ...(t.symbol ? { symbol: t.symbol } : {}) },
    hoverinfo: smoothing > 0 ? "skip" : t.text ? "x+text" : "x+y+name",
  }));
  if (smoothing > 0) {
    traces.forEach((t, i) => data.push({
      type: t.x.length > 20000 ? "scattergl" : "scatter",
      mode: t.x.length === 1 ? "markers" : "lines",
      name: plotlyText(t.name),
      x: t.x.slice(),
      y: ema(t.y, smoothing),
      legendgroup: t.name,
      showlegend: multi,
      line: { color: t.color || PALETTE[i % PALETTE.length], width: 1.8 },
      marker: { color: t.color || PALETTE[i % PALETTE.length], size: 5 },
    }));
  }
  const { ink, grid, muted } = pageColors();
  const layout = {
    title: { text: plotlyText(title), font: { size: 13 }, x: 0.01, xanchor: "left" },
    height: opts.height || 260,
    margin: { l: 56, r: 14, t: multi ? 46 : 34, b: 40 },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 11, color: ink },
    showlegend: multi,
    legend: { orientation: "h", x: 1, xanchor: "right", y: 1.02, yanchor: "bottom", font: { size: 10 } },
    uirevision: title,
    xaxis: { title: { text: plotlyText(opts.xTitle ?? "step") }, type: opts.xType || "-", zeroline: false, automargin: true, gridcolor: grid },
    // marks (restarts): dashed vertical lines at these x values, labelled
    shapes: (opts.marks || []).map((m) => ({ type: "line", xref: "x", yref: "paper", x0: m.x, x1: m.x, y0: 0, y1: 1,
      line: { color: m.color || muted, width: 1, dash: "dash" } })),
    annotations: (opts.marks || []).map((m) => ({ x: m.x, xref: "x", yref: "paper", y: 1, yanchor: "bottom",
      text: plotlyText(m.label || "restart"), showarrow: false, font: { size: 9, color: m.color || muted } })),
    yaxis: {
      gridcolor: grid,
      type: opts.log ? "log" : "linear",
      uirevision: opts.log ? "log" : "linear",
      zeroline: false,
      automargin: true,
      ...(opts.yBytes ? { exponentformat: "SI", ticksuffix: "B" } : {}),
      ...(opts.yaxis || {}),
    },
  };
  const config = {
    responsive: true,
    displaylogo: false,
    modeBarButtonsToRemove: ["lasso2d", "select2d"],
  };
  window.Plotly.react(el, data, layout, config);
}

/** A set of charts in one container: one chart per key, kept in key order. */
export class ChartGrid {
  constructor(container, testidPrefix, opts, axes = {}) {
    this.container = container;
    this.prefix = testidPrefix;
    this.opts = opts; // shared with other grids of the page: smoothing, log
    this.axes = axes; // this grid's own: xType, xTitle
    this.charts = new Map(); // key -> {el, title, traces}
  }

  set(key, title, traces) {
    let chart = this.charts.get(key);
    if (!chart) {
      const el = h("div", { class: "chart", testid: `${this.prefix}${key}`, "data-metric": key });
      chart = { el, title, traces };
      this.charts.set(key, chart);
      const after = [...this.charts.keys()].sort().find((k) => k > key && this.charts.get(k).el.isConnected);
      this.container.insertBefore(el, after ? this.charts.get(after).el : null);
    }
    const added = !chart.drawn;
    chart.title = title;
    chart.traces = traces;
    chart.axes = { ...this.axes };
    drawChart(chart.el, title, traces, { ...this.opts, ...chart.axes });
    chart.drawn = true;
    if (added && window.Plotly) {
      // a new chart changes the grid's columns (auto-fit): the others take their new widths
      for (const other of this.charts.values()) {
        if (other !== chart && other.drawn) window.Plotly.Plots.resize(other.el);
      }
    }
  }

  keep(keys) {
    for (const [key, chart] of this.charts) {
      if (!keys.has(key)) {
        if (window.Plotly) window.Plotly.purge(chart.el);
        chart.el.remove();
        this.charts.delete(key);
      }
    }
  }

  redraw() {
    for (const chart of this.charts.values()) drawChart(chart.el, chart.title, chart.traces, { ...this.opts, ...chart.axes });
  }

  get size() {
    return this.charts.size;
  }
}

/** Smoothing slider and log-scale toggle shared by the charts of a page. */
export function chartControls(opts, onchange, prefix = "") {
  const value = h("span", { class: "num", testid: `${prefix}smoothing-value` }, opts.smoothing.toFixed(2));
  const slider = h("input", {
    type: "range", min: "0", max: "0.99", step: "0.01", value: String(opts.smoothing),
    testid: `${prefix}smoothing`, "aria-label": "smoothing",
    oninput: () => {
      opts.smoothing = Number(slider.value);
      value.textContent = opts.smoothing.toFixed(2);
      onchange();
    },
  });
  const log = h("input", {
    type: "checkbox", checked: opts.log, testid: `${prefix}log-scale`,
    onchange: () => {
      opts.log = log.checked;
      onchange();
    },
  });
  return h("div", { class: "controls" },
    h("label", { title: "Exponential moving average; the raw series stays behind it" }, "Smoothing ", slider, " ", value),
    h("label", {}, log, " log scale"));
}

/** Does the metrics route speak max_points/after_step? (It then reports total_points.) */
export function incrementalMetrics(data) {
  if (!data || typeof data !== "object") return false;
  if ("total_points" in data) return true;
  return Array.isArray(data.series) && data.series.some((s) => s && "total_points" in s);
}

/**
 * A job's own metric series (rank null), kept in step with the server: the first read is
 * downsampled to MAX_POINTS where supported, then only points after the last step are asked
 * for; a restart (steps may be replaced), a series grown past 2*MAX_POINTS, the job's end and
 * every FULL_REFETCH_MS bring a full read again.
 */
export class MetricSeries {
  constructor(jobId) {
    this.jobId = jobId;
    this.series = new Map(); // name -> {x: [], y: []}
    this.incremental = false;
    this.lastStep = null;
    this.attempts = null;
    this.fullAt = 0;
    this.complete = false; // the job ended and the last full read came after it
  }

  /** The job was resumed: read it again as it runs. */
  reopen() {
    this.complete = false;
  }

  async update(job) {
    const ended = job && TERMINAL.has(job.state);
    if (this.complete) return false;
    const attempts = job ? job.attempts : null;
    const grown = [...this.series.values()].some((s) => s.x.length > 2 * MAX_POINTS);
    const full = !this.incremental || this.lastStep === null || ended || grown ||
      attempts !== this.attempts || Date.now() - this.fullAt > FULL_REFETCH_MS;
    const params = new URLSearchParams({ max_points: String(MAX_POINTS) });
    if (!full) params.set("after_step", String(this.lastStep));
    const data = await api(`/jobs/${this.jobId}/metrics?${params}`);
    this.incremental = incrementalMetrics(data);
    this.attempts = attempts;
    let changed = full;
    if (full) {
      this.series = new Map();
      this.fullAt = Date.now();
    }
    for (const s of data.series || []) {
      if (s.rank !== null && s.rank !== undefined) continue;
      let target = this.series.get(s.name);
      if (!target) {
        target = { x: [], y: [], t: [] }; // steps, values, wall times
        this.series.set(s.name, target);
      }
      for (const [step, value, wall] of s.points) {
        const n = target.x.length;
        if (n && step <= target.x[n - 1]) {
          if (step === target.x[n - 1]) target.y[n - 1] = value; // re-logged: the newer value
          continue;
        }
        target.x.push(step);
        target.y.push(value);
        target.t.push(wall);
        changed = true;
      }
    }
    let last = null;
    for (const s of this.series.values()) {
      if (s.x.length) last = last === null ? s.x[s.x.length - 1] : Math.max(last, s.x[s.x.length - 1]);
    }
    this.lastStep = last;
    if (ended) this.complete = true;
    return changed;
  }
}

/** Series out of a monitoring response, whatever its exact shape: [{name, label, x, y, time}]. */
export function systemSeries(data) {
  const out = [];
  if (!data || typeof data !== "object") return out;
  const timeKeys = ["t", "time", "at", "ts", "timestamp", "wall_time", "sampled_at"];
  const labelKeys = ["node", "host", "gpu", "device", "rank", "index"];
  const pick = (obj, keys) => keys.find((k) => obj[k] !== undefined && obj[k] !== null);
  const push = (name, label, x, y) => {
    if (!x.length) return;
    const time = typeof x[0] === "number" && x[0] > 1e9;
    out.push({ name, label, x: time ? x.map((v) => (v > 1e12 ? v : v * 1000)) : x, y, time });
  };
  const list = Array.isArray(data) ? data : Array.isArray(data.series) ? data.series : null;
  if (list) {
    for (const s of list) {
      if (!s || typeof s !== "object") continue;
      const name = String(s.name ?? s.metric ?? s.key ?? "value");
      const label = labelKeys.filter((k) => s[k] !== undefined && s[k] !== null).map((k) => `${k} ${s[k]}`).join(" ");
      let x = [];
      let y = [];
      if (Array.isArray(s.points)) {
        for (const p of s.points) {
          if (Array.isArray(p)) {
            x.push(p[0]);
            y.push(p[1]);
          } else if (p && typeof p === "object") {
            const tk = pick(p, [...timeKeys, "step", "x"]);
            x.push(tk ? p[tk] : x.length);
            y.push(p.value ?? p.v ?? p.y ?? null);
          }
        }
      } else if (Array.isArray(s.x) && Array.isArray(s.y)) {
        x = s.x;
        y = s.y;
      } else if (Array.isArray(s.values)) {
        const tk = pick(s, ["times", "timestamps", "t", "at"]);
        x = tk ? s[tk] : s.values.map((_, i) => i);
        y = s.values;
      }
      push(name, label, x, y);
    }
    return out;
  }
  if (Array.isArray(data.samples)) {
    const by = new Map();
    for (const sample of data.samples) {
      if (!sample || typeof sample !== "object") continue;
      const tk = pick(sample, timeKeys);
      for (const [k, v] of Object.entries(sample)) {
        if (k === tk || typeof v !== "number") continue;
        if (!by.has(k)) by.set(k, { x: [], y: [] });
        by.get(k).x.push(tk ? sample[tk] : by.get(k).x.length);
        by.get(k).y.push(v);
      }
    }
    for (const [k, s] of by) push(k, "", s.x, s.y);
    return out;
  }
  for (const [k, v] of Object.entries(data)) {
    if (Array.isArray(v) && v.length && Array.isArray(v[0])) push(k, "", v.map((p) => p[0]), v.map((p) => p[1]));
  }
  return out;
}

export const SYSTEM_TITLES = {
  cpu_percent: "CPU %",
  rss_bytes: "memory (RSS)",
  processes: "processes",
  memory_used_bytes: "memory used",
  memory_total_bytes: "memory total",
  gpu_memory_bytes: "GPU memory",
  DCGM_FI_DEV_GPU_UTIL: "GPU utilization %",
  DCGM_FI_DEV_FB_USED: "GPU memory used (MiB)",
  DCGM_FI_DEV_FB_FREE: "GPU memory free (MiB)",
  DCGM_FI_DEV_POWER_USAGE: "GPU power (W)",
  DCGM_FI_DEV_GPU_TEMP: "GPU temperature (°C)",
};

/** Draws systemSeries(data) (or series already made) into a grid: a chart per name. */
export function drawSystem(grid, data) {
  const series = Array.isArray(data) ? data : systemSeries(data);
  const names = new Set();
  const byName = new Map();
  for (const s of series) {
    if (!byName.has(s.name)) byName.set(s.name, []);
    byName.get(s.name).push(s);
  }
  for (const [name, list] of byName) {
    names.add(name);
    const time = list.some((s) => s.time);
    grid.axes.xType = time ? "date" : "-";
    grid.axes.xTitle = time ? "" : "sample";
    grid.axes.yBytes = /bytes$/.test(name);
    grid.set(name, SYSTEM_TITLES[name] || name, list.map((s) => ({ name: s.label || name, x: s.x, y: s.y })));
  }
  grid.keep(names);
  return series.length;
}
