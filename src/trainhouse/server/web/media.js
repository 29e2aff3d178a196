// The media a job logged (run.log_image, log_histogram, log_table; TensorBoard's images and
// histograms; MLflow's log_image and log_table) on its page: one card per key, showing the
// item at the step the slider picks (the last one logged at or before it). Tables and
// captions are text (never HTML); images are the PNGs the server checked, fetched as blobs.
import { api, fmtBytes, h, POLL_MS } from "./core.js";

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

function fmtNum(x) {
  return Math.abs(x) >= 1e4 || (x !== 0 && Math.abs(x) < 1e-3) ? x.toExponential(2) : String(+x.toPrecision(4));
}

/** A histogram's 64 buckets as bars, its range under them and what was not bucketed. */
export function histogramView(data) {
  const W = 360, H = 120, n = data.buckets.length;
  const top = Math.max(1, ...data.buckets);
  const bars = data.buckets.map((c, i) => {
    const bh = (c / top) * (H - 4);
    const lo = data.min + ((data.max - data.min) * i) / n;
    const hi = data.min + ((data.max - data.min) * (i + 1)) / n;
    return svg("rect", { x: (i * W) / n, y: H - bh, width: Math.max(1, W / n - 1), height: bh, class: "media-bar", "data-count": c },
      svg("title", {}, `${fmtNum(lo)} to ${fmtNum(hi)}: ${c}`));
  });
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": "histogram" }, ...bars);
  const apart = [["NaN", data.nan], ["+inf", data.inf], ["-inf", data.neginf]].filter(([, c]) => c > 0);
  return h("div", { testid: "media-histogram" }, chart,
    h("div", { class: "media-range small muted" }, h("span", {}, fmtNum(data.min)), h("span", {}, fmtNum(data.max))),
    h("div", { class: "small muted", testid: "media-histogram-note" },
      `${data.count} values`,
      apart.length ? `; not bucketed: ${apart.map(([k, c]) => `${c} ${k}`).join(", ")}` : ""));
}

/** A table's cells as text. */
export function tableView(data) {
  const cell = (v) => (v === null || v === undefined ? "" : String(v));
  return h("div", { class: "table-wrap" },
    h("table", { class: "grid media-table", testid: "media-table" },
      h("thead", {}, h("tr", {}, data.columns.map((c) => h("th", {}, c)))),
      h("tbody", {}, data.rows.map((r) => h("tr", {}, r.map((v) => h("td", {}, cell(v))))))));
}

/** The job's media section: hidden until the job has logged some; polled while it runs. */
export function jobMedia(view, jobId, ended) {
  const cache = new Map(); // item id -> its data (a histogram, a table) or an object URL
  let items = [];
  let steps = [];
  let follow = true; // the slider stays on the last step until it is moved
  const slider = h("input", { type: "range", min: 0, max: 0, value: 0, step: 1, testid: "media-step",
    oninput: () => { follow = Number(slider.value) === steps.length - 1; show(); } });
  const label = h("span", { testid: "media-step-label" }, "");
  const grid = h("div", { class: "media-grid" });
  const el = h("section", { class: "card", testid: "media-section", hidden: true },
    h("div", { class: "card-head" }, h("h2", {}, "Media"),
      h("label", { class: "controls" }, "step ", slider, label)),
    grid);

  async function content(item) {
    if (cache.has(item.id)) return cache.get(item.id);
    let value;
    if (item.kind === "image") {
      const resp = await api(`/jobs/${jobId}/media/${item.id}/image`, { raw: true });
      value = URL.createObjectURL(await resp.blob());
    } else {
      value = (await api(`/jobs/${jobId}/media/${item.id}`)).data;
    }
    cache.set(item.id, value);
    return value;
  }

  function render(item, value) {
    if (item.kind === "image") {
      // a small image is scaled up by a whole factor (pixels kept sharp), a large one down to 480
      const side = Math.max(item.width, item.height);
      const scale = side >= 480 ? 480 / side : Math.max(1, Math.floor(192 / side));
      return h("figure", {},
        h("img", { src: value, alt: item.caption || item.key, testid: "media-image",
          width: Math.round(item.width * scale), height: Math.round(item.height * scale),
          "data-item": item.id, class: "media-image" }),
        item.caption ? h("figcaption", { class: "small muted" }, item.caption) : null);
    }
    return item.kind === "histogram" ? histogramView(value) : tableView(value);
  }

  let drawn = 0;
  async function show() {
    const at = steps[Number(slider.value)];
    label.textContent = at === undefined ? "" : String(at);
    const byKey = new Map();
    for (const it of items) if (it.step <= at) byKey.set(it.key, it); // items come by key, then step
    const keys = [...new Set(items.map((it) => it.key))];
    const turn = ++drawn;
    const cards = await Promise.all(keys.map(async (key) => {
      const item = byKey.get(key);
      const kind = items.find((it) => it.key === key).kind;
      const head = h("div", { class: "media-head" }, h("strong", {}, key),
        item ? h("span", { class: "small muted", testid: "media-item-step" }, ` step ${item.step} · ${fmtBytes(item.size)}`) : null);
      const body = item ? render(item, await content(item)) : h("p", { class: "muted small" }, `nothing at or before step ${at}`);
      return h("div", { class: `media-card media-kind-${kind}`, testid: "media-card", "data-key": key }, head, body);
    }));
    if (turn === drawn) grid.replaceChildren(...cards); // a later move of the slider wins
  }

  view.poll(async () => {
    const data = await api(`/jobs/${jobId}/media`);
    const fresh = data.items;
    const changed = fresh.length !== items.length ||
      fresh.some((it, i) => it.id !== items[i].id || it.created_at !== items[i].created_at);
    if (changed) {
      for (const it of fresh) {
        const old = items.find((o) => o.id === it.id);
        if (old && old.created_at !== it.created_at) cache.delete(it.id); // replaced
      }
      items = fresh;
      steps = [...new Set(items.map((it) => it.step))].sort((a, b) => a - b);
      el.hidden = items.length === 0;
      slider.max = String(Math.max(0, steps.length - 1));
      if (follow) slider.value = slider.max;
      await show();
    }
    return !ended();
  }, POLL_MS * 2.5);
  return el;
}
