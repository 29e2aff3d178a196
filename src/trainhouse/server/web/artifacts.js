// A job's artifacts on its page (#/jobs/<id>): the files it kept (run.log_artifact, MLflow's
// log_artifact) with their sizes, each downloadable; a text file, a small table (CSV/TSV) or a
// raster image shown below the list on request. Every file is job-written: text goes into the
// page as text (never as HTML), an image is an <img> of what the server serves as a sniffed
// PNG/JPEG/GIF/WebP (nosniff, a CSP that allows nothing), and anything larger than the server's
// inline bound, or of another kind, is a download only.
import { API, ApiError, TERMINAL, api, fmtBytes, fmtTime, h } from "./core.js";

/** Files shown on the page at most this large (the server refuses larger inline views). */
export const MAX_INLINE = 2 * 1024 * 1024;
/** Rows and columns of a table drawn from a CSV/TSV (the rest: download it). */
const MAX_ROWS = 200;
const MAX_COLS = 50;

function contentUrl(jobId, path, inline) {
  return `${API}/jobs/${jobId}/artifacts/content?path=${encodeURIComponent(path)}` + (inline ? "&inline=true" : "");
}

/** Split one CSV/TSV line (quotes as in RFC 4180: "a,b" and "" inside). */
function splitLine(line, sep) {
  const out = [];
  let cell = "";
  let quoted = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quoted) {
      if (c === '"' && line[i + 1] === '"') { cell += '"'; i++; }
      else if (c === '"') quoted = false;
      else cell += c;
    } else if (c === '"' && cell === "") quoted = true;
    else if (c === sep) { out.push(cell); cell = ""; }
    else cell += c;
  }
  out.push(cell);
  return out;
}

function tableOf(text, path) {
  const sep = path.toLowerCase().endsWith(".tsv") ? "\t" : ",";
  const lines = text.split(/\r?\n/).filter((l) => l !== "");
  if (!lines.length) return h("p", { class: "muted" }, "(empty)");
  const rows = lines.slice(0, MAX_ROWS + 1).map((l) => splitLine(l, sep).slice(0, MAX_COLS));
  const [head, ...body] = rows;
  const table = h("table", { class: "grid", testid: "artifact-table" },
    h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))),
    h("tbody", {}, body.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))));
  const more = lines.length > MAX_ROWS + 1 ? h("p", { class: "muted small" },
    `the first ${MAX_ROWS} of ${lines.length - 1} rows; download it for all`) : null;
  return h("div", { class: "artifact-table" }, table, more);
}

/** The artifacts card: `el` to place on the page; it polls until the job has ended. */
export function artifactsCard(view, jobId, jobNow) {
  const list = h("div", { testid: "artifacts" }, h("p", { class: "muted" }, "Loading…"));
  const shown = h("div", { class: "artifact-view", testid: "artifact-view", hidden: true });
  const summary = h("span", { class: "muted small", testid: "artifacts-summary" });
  let lastKey = "";
  let showing = null;

  const show = async (a) => {
    showing = a.path;
    shown.hidden = false;
    const title = h("div", { class: "card-head" }, h("h3", { class: "mono" }, a.path),
      h("a", { href: contentUrl(jobId, a.path, false), download: a.path.split("/").pop() }, "download"),
      h("button", { class: "small", onclick: () => { showing = null; shown.hidden = true; shown.replaceChildren(); } }, "close"));
    if (a.size > MAX_INLINE) {
      shown.replaceChildren(title, h("p", { class: "muted", testid: "artifact-too-large" },
        `${fmtBytes(a.size)}: too large to show here (up to ${fmtBytes(MAX_INLINE)}); download it.`));
      return;
    }
    if (a.kind === "image") {
      const img = h("img", { src: contentUrl(jobId, a.path, true), alt: a.path, testid: "artifact-image" });
      img.addEventListener("error", () => img.replaceWith(h("p", { class: "error" },
        "not a PNG, JPEG, GIF or WebP image: download it to look at it")));
      shown.replaceChildren(title, img);
      return;
    }
    shown.replaceChildren(title, h("p", { class: "muted" }, "Loading…"));
    try {
      const resp = await api(`/jobs/${jobId}/artifacts/content?path=${encodeURIComponent(a.path)}&inline=true`, { raw: true });
      const type = resp.headers.get("Content-Type") || "";
      if (showing !== a.path) return;
      if (type.startsWith("image/")) {
        shown.replaceChildren(title, h("img", { src: contentUrl(jobId, a.path, true), alt: a.path, testid: "artifact-image" }));
        return;
      }
      const text = await resp.text();
      if (showing !== a.path) return;
      shown.replaceChildren(title, a.kind === "table" ? tableOf(text, a.path)
        : h("pre", { class: "spec", testid: "artifact-text" }, text));
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      if (showing === a.path) shown.replaceChildren(title, h("p", { class: "error", testid: "artifact-error" }, err.message));
    }
  };

  const render = (data) => {
    const files = data.artifacts || [];
    summary.textContent = files.length ? `${files.length} file${files.length === 1 ? "" : "s"}, ${fmtBytes(data.total_bytes)}` : "";
    if (!files.length) {
      list.replaceChildren(h("p", { class: "muted" }, "No artifacts kept yet (run.log_artifact, or MLflow's log_artifact)."));
      return;
    }
    const rows = files.map((a) => h("tr", { testid: "artifact-row", "data-path": a.path },
      h("td", { class: "mono" },
        h("a", { href: "#", testid: "artifact-open", title: "show it here", onclick: (ev) => { ev.preventDefault(); show(a); } }, a.path)),
      h("td", { class: "num", testid: "artifact-size", title: `${a.size} bytes` }, fmtBytes(a.size)),
      h("td", {}, a.kind),
      h("td", {}, fmtTime(a.mtime)),
      h("td", {}, h("a", { href: contentUrl(jobId, a.path, false), download: a.path.split("/").pop(), testid: "artifact-download" }, "download"))));
    const notes = [];
    if (data.skipped) notes.push(h("p", { class: "muted small", testid: "artifacts-skipped" },
      `${data.skipped} entr${data.skipped === 1 ? "y" : "ies"} left out: links, FIFOs, devices or hard-linked files are no artifacts.`));
    if (data.truncated) notes.push(h("p", { class: "muted small" }, "The listing stopped at its bound: not every file is shown."));
    list.replaceChildren(h("table", { class: "grid", testid: "artifacts-table" },
      h("thead", {}, h("tr", {}, h("th", {}, "Path"), h("th", {}, "Size"), h("th", {}, "Kind"), h("th", {}, "Written"), h("th", {}, ""))),
      h("tbody", {}, rows)), ...notes);
  };

  view.poll(async () => {
    const data = await api(`/jobs/${jobId}/artifacts`);
    const key = JSON.stringify(data);
    if (key !== lastKey) {
      lastKey = key;
      render(data);
    }
    const job = jobNow();
    return !(job && TERMINAL.has(job.state));
  }, 5000);

  const el = h("section", { class: "card", testid: "artifacts-section" },
    h("div", { class: "card-head" }, h("h2", {}, "Artifacts"), summary), list, shown);
  return { el };
}
