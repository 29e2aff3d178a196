// Constants, DOM and API helpers, formatting, and the views' polling.
export const API = "/api/v1";
export const POLL_MS = 2000;
export const LOG_POLL_MS = 1000;
export const HIDDEN_POLL_MS = 10000; // a background tab polls slowly
export const MAX_POINTS = 2000; // downsampled fetches of long series (when the server supports it)
export const FULL_REFETCH_MS = 30000; // incremental series are re-read in full this often
export const LOG_TAIL_LINES = 2000;
export const LOG_MAX_LINES = 20000; // older lines leave the page (the raw link has them all)
export const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELED"]);
export const STATES = ["QUEUED", "RUNNING", "RESTARTING", "PREEMPTED", "COMPLETED", "FAILED", "CANCELED"];
export const PALETTE = ["#2b59c3", "#e4572e", "#17a398", "#f3a712", "#8e44ad", "#6c757d", "#d81b60",
  "#00838f", "#7cb342", "#5d4037"];

// ---------------------------------------------------------------------------------- helpers

/** h("a", {href, class, testid, onclick}, ...children): an element; text children are escaped. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (key === "testid") {
      el.dataset.testid = value;
    } else if (key === "value" || key === "checked" || key === "selected" || key === "hidden") {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  add(el, children);
  return el;
}

export function add(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** fetch API+path; JSON back (or the Response with {raw: true}); errors become ApiError.
 * The session cookie signs requests in; the X-Trainhouse-Request header lets a cookie write
 * through (the server refuses cookie writes without it: no cross-site request can add it).
 * A 401 sends "trainhouse:signin" to the page, which asks for a token. */
export async function api(path, options = {}) {
  const { raw, ...init } = options;
  init.headers = { "X-Trainhouse-Request": "1", ...(init.headers || {}) };
  init.credentials = "same-origin";
  const resp = await fetch(API + path, init);
  if (resp.status === 401) window.dispatchEvent(new CustomEvent("trainhouse:signin"));
  if (!resp.ok) {
    let body = null;
    try {
      body = await resp.json();
    } catch (_) {
      // not JSON: fall back on the status text
    }
    const err = body && body.error ? body.error : {};
    throw new ApiError(resp.status, err.code || "http_error", err.message || resp.statusText);
  }
  return raw ? resp : resp.json();
}

export const conn = () => document.getElementById("conn");

export function online() {
  const el = conn();
  if (el && el.dataset.state !== "live") {
    el.dataset.state = "live";
    el.textContent = "live";
    el.title = "Updates arrive without reloading";
  }
}

export function problem(err) {
  const el = conn();
  if (!el) return;
  el.dataset.state = "error";
  el.textContent = err instanceof TypeError ? "server unreachable, retrying" : "error";
  el.title = String(err && err.message ? err.message : err);
  if (!(err instanceof ApiError) && !(err instanceof TypeError)) console.error(err);
}

export function fmtNum(v) {
  if (v === null || v === undefined) return "—";
  if (typeof v !== "number") return String(v);
  if (!Number.isFinite(v)) return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
  return String(Number(v.toPrecision(4)));
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

export function fmtTime(t) {
  return t ? new Date(t * 1000).toLocaleString() : "—";
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || seconds < 0) return "—";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

export function ago(t) {
  if (!t) return "—";
  const s = Date.now() / 1000 - t;
  if (s < 60) return `${Math.max(0, Math.round(s))}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(t * 1000).toLocaleDateString();
}

export function timeCell(t) {
  return h("time", { title: fmtTime(t), datetime: t ? new Date(t * 1000).toISOString() : null }, ago(t));
}

export function badge(state, testid) {
  return h("span", { class: `badge state-${String(state).toLowerCase()}`, testid }, state);
}

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

export function progressOf(job) {
  const done = job.last_step === null || job.last_step === undefined ? null : job.last_step + 1;
  const total = job.total_steps;
  const text = done === null ? "—" : total ? `${done}/${total}` : `step ${job.last_step}`;
  const frac = done !== null && total ? Math.min(1, done / total) : null;
  return { text, frac, title: done === null ? "no step reported yet" : `last step ${job.last_step}` + (total ? ` of ${total} steps` : "") };
}

export function progressCell(job) {
  const p = progressOf(job);
  return h("div", { class: "progress", title: p.title },
    p.frac === null ? null : h("div", { class: "bar" }, h("div", { style: `width:${(p.frac * 100).toFixed(1)}%` })),
    h("span", { class: "num" }, p.text));
}

export function metricsText(latest, max = 3) {
  const entries = Object.entries(latest || {});
  if (!entries.length) return "—";
  return entries.slice(0, max).map(([k, v]) => `${k} ${fmtNum(v)}`).join(" · ") + (entries.length > max ? " …" : "");
}

export function worldSize(spec) {
  const res = (spec && spec.resources) || {};
  return Math.max(1, (res.nodes || 1) * (res.procs_per_node || res.gpus_per_node || 1));
}

/** A small YAML rendering of the spec (display only). */
export function toYaml(value) {
  const out = [];
  const complex = (v) => v !== null && typeof v === "object" && Object.keys(v).length > 0;
  const scalar = (v) => {
    if (v === null || v === undefined) return "null";
    if (Array.isArray(v)) return "[]";
    if (typeof v === "object") return "{}";
    if (typeof v !== "string") return String(v);
    const plain = /^[A-Za-z0-9_./@+-][A-Za-z0-9_ ./@,+=-]*$/.test(v) && !/\s$/.test(v) &&
      !/^(true|false|null|yes|no|on|off|~|[-+]?(\d[\d_]*)?\.?\d*(e[-+]?\d+)?)$/i.test(v);
    return plain ? v : JSON.stringify(v);
  };
  const key = (k) => (/^[A-Za-z_][A-Za-z0-9_.-]*$/.test(k) ? k : JSON.stringify(k));
  const emit = (buf, v, pad) => {
    if (Array.isArray(v)) {
      for (const item of v) {
        if (complex(item)) {
          const sub = [];
          emit(sub, item, pad + "  ");
          buf.push(`${pad}- ${sub[0].trimStart()}`, ...sub.slice(1));
        } else {
          buf.push(`${pad}- ${scalar(item)}`);
        }
      }
    } else {
      for (const [k, item] of Object.entries(v)) {
        if (complex(item)) {
          buf.push(`${pad}${key(k)}:`);
          emit(buf, item, pad + "  ");
        } else {
          buf.push(`${pad}${key(k)}: ${scalar(item)}`);
        }
      }
    }
  };
  if (complex(value)) emit(out, value, "");
  else out.push(scalar(value));
  return out.join("\n") + "\n";
}

// --------------------------------------------------------------------- views and polling

/** Runs fn now and then every ms, never two at once, until the view ends or fn returns false. */
export class Poller {
  constructor(view, fn, ms) {
    this.view = view;
    this.fn = fn;
    this.ms = ms;
    this.timer = null;
    this.running = false;
    this.again = false;
    this.stopped = false;
    setTimeout(() => this.now(), 0);
  }

  async now() {
    if (this.stopped || !this.view.alive) return;
    if (this.running) {
      this.again = true;
      return;
    }
    clearTimeout(this.timer);
    this.running = true;
    let keep = true;
    try {
      keep = (await this.fn()) !== false;
      online();
    } catch (err) {
      problem(err);
    }
    this.running = false;
    if (this.stopped || !this.view.alive) return;
    if (this.again) {
      this.again = false;
      this.now();
      return;
    }
    if (!keep) return;
    this.timer = setTimeout(() => this.now(), document.hidden ? HIDDEN_POLL_MS : this.ms);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}

export class View {
  constructor() {
    this.alive = true;
    this.pollers = [];
  }

  poll(fn, ms) {
    const p = new Poller(this, fn, ms);
    this.pollers.push(p);
    return p;
  }

  wake() {
    for (const p of this.pollers) if (!p.stopped) p.now();
  }

  stop() {
    this.alive = false;
    for (const p of this.pollers) p.stop();
  }
}

export function kv(label, value, testid) {
  return [h("dt", {}, label), h("dd", { testid }, value)];
}

export function placementText(placement) {
  if (!placement) return "—";
  const nodes = Array.isArray(placement.nodes) ? placement.nodes : Array.isArray(placement) ? placement : null;
  if (!nodes) return JSON.stringify(placement);
  return nodes.map((p) => `${p.node ?? "?"}${p.gpus && p.gpus.length ? ` (GPUs ${p.gpus.join(",")})` : ""}${p.procs ? ` ×${p.procs}` : ""}`).join(", ");
}
