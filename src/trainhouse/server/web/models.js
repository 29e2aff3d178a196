// The model registry: #/models (every model) and #/models/<name> (its versions: aliases, the
// job that made each one, its step, metrics, files and signature, the services that serve it,
// the jobs that read it as an input; ?version=N marks that version's row; then what jobs'
// promote: decided about its versions, newest first).
import { POLL_MS, api, fmtBytes, fmtNum, h, timeCell } from "./core.js";

const head = (cols) => h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c))));
export const modelHref = (name, version) =>
  `#/models/${encodeURIComponent(name)}${version === null || version === undefined ? "" : `?version=${version}`}`;

function jobLinks(ids, testid) {
  if (!ids || !ids.length) return "—";
  return ids.flatMap((id, i) => [i ? ", " : null, h("a", { href: `#/jobs/${id}`, testid }, `#${id}`)]);
}

function promotionRows(name, promotions) {
  if (!promotions.length) {
    return [h("tr", { class: "empty" }, h("td", { colspan: "4" },
      "No promotion yet: a job with promote: {alias, metric} decides one when it completes."))];
  }
  return promotions.map((p) => h("tr", { testid: "promotion-row", "data-job-id": p.job_id,
    "data-promoted": p.promoted === null ? "pending" : String(p.promoted) },
  h("td", {}, p.decided_at ? timeCell(p.decided_at) : h("span", { class: "muted" }, "pending")),
  h("td", { class: "reason", testid: "promotion-decision" }, p.promoted === null
    ? `pending: ${p.alias} by ${p.mode} ${p.metric} (decided when job ${p.job_id} completes)`
    : p.decision || (p.promoted ? `promoted to ${p.alias}` : `kept ${p.alias}`)),
  h("td", { class: "num" }, p.version === null ? "—" : h("a", { href: modelHref(name, p.version), testid: "promotion-version" }, `v${p.version}`)),
  h("td", {}, h("a", { href: `#/jobs/${p.job_id}`, testid: "promotion-job" }, `job #${p.job_id}`))));
}

function aliasText(aliases) {
  const names = Object.entries(aliases || {}).sort();
  return names.length ? names.map(([a, v]) => `${a} → ${v}`).join(", ") : "—";
}

function metricText(metrics) {
  const names = Object.keys(metrics || {}).sort();
  return names.length ? names.map((k) => `${k}=${fmtNum(metrics[k])}`).join(" ") : "—";
}

function tensorText(spec) {
  const dims = spec.shape.map((d) => (d === null ? "batch" : String(d))).join(", ");
  return `${spec.name}: ${spec.dtype}[${dims}]`;
}

function signatureCell(sig) {
  const ins = (sig.inputs || []).map(tensorText).join("; ");
  const outs = (sig.outputs || []).map(tensorText).join("; ");
  return h("code", { testid: "version-signature" }, `${ins || "?"} → ${outs || "?"}`);
}

export function modelsPage(view) {
  const rows = h("tbody", { testid: "model-rows" });
  view.poll(async () => {
    const { models } = await api("/models");
    rows.replaceChildren(...(models.length ? models.map((m) => h("tr", { testid: "model-row", "data-model": m.name },
      h("td", {}, h("a", { href: `#/models/${encodeURIComponent(m.name)}` }, m.name)),
      h("td", { class: "num" }, String(m.versions)),
      h("td", { class: "num" }, m.latest === null ? "—" : String(m.latest)),
      h("td", { testid: "model-aliases" }, aliasText(m.aliases)),
      h("td", {}, m.owner),
      h("td", {}, timeCell(m.created_at))))
      : [h("tr", { class: "empty" }, h("td", { colspan: "6" },
        "No models yet: run.save_model(...) in a training script registers one."))]));
  }, POLL_MS);
  return h("section", { class: "page models" },
    h("div", { class: "toolbar" }, h("h1", {}, "Models")),
    h("section", { class: "card" }, h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "models-table" },
      head(["Name", "Versions", "Latest", "Aliases", "Owner", "Created"]), rows))));
}

/** The services of `model` that answer with `version` now (or will: starting on it). */
function servedBy(services, model, version) {
  const found = services.filter((s) => s.model === model && (s.versions.includes(version) ||
    (!s.versions.length && s.target_version === version && (s.state === "queued" || s.state === "starting"))));
  if (!found.length) return "—";
  return found.flatMap((s, i) => [i ? ", " : null, h("a", { href: `#/services/${encodeURIComponent(s.name)}`,
    testid: "version-service", title: s.state }, s.name), s.versions.includes(version) ? null : " (starting)"]);
}

export function modelPage(view, name, selected) {
  const rows = h("tbody", { testid: "version-rows" });
  const title = h("h1", {}, name);
  const owner = h("span", { class: "muted", testid: "model-owner" });
  const promotions = h("tbody", { testid: "promotion-rows" });
  let scrolled = false;
  view.poll(async () => {
    const [data, { services }] = await Promise.all([api(`/models/${encodeURIComponent(name)}`), api("/services")]);
    document.title = `${name} · trainhouse`;
    owner.textContent = `owner ${data.model.owner} · aliases ${aliasText(data.model.aliases)}`;
    rows.replaceChildren(...[...data.versions].reverse().map((v) => h("tr", { testid: "version-row", "data-version": v.version,
      class: String(v.version) === selected ? "selected" : null },
      h("td", { class: "num" }, String(v.version)),
      h("td", { testid: "version-aliases" }, v.aliases.length ? v.aliases.join(", ") : "—"),
      h("td", {}, v.job_id === null ? "deleted" : h("a", { href: `#/jobs/${v.job_id}`, testid: "version-job" },
        `job #${v.job_id}`)),
      h("td", { class: "num" }, String(v.step)),
      h("td", { testid: "version-metrics" }, metricText(v.metrics)),
      h("td", {}, v.kind),
      h("td", { class: "num" }, fmtBytes(v.size)),
      h("td", {}, signatureCell(v.signature)),
      h("td", { testid: "version-services" }, servedBy(services, name, v.version)),
      h("td", { testid: "version-readers" }, jobLinks((data.readers || {})[String(v.version)], "version-reader")),
      h("td", {}, timeCell(v.created_at)))));
    promotions.replaceChildren(...promotionRows(name, data.promotions || []));
    const mark = rows.querySelector("tr.selected");
    if (mark && !scrolled) mark.scrollIntoView({ block: "nearest" });
    scrolled = scrolled || Boolean(mark);
  }, POLL_MS);
  return h("section", { class: "page model" },
    h("div", { class: "toolbar" }, h("a", { href: "#/models" }, "Models"), title, owner),
    h("section", { class: "card" }, h("h2", {}, "Versions, newest first"),
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "versions-table" },
        head(["Version", "Aliases", "Made by", "Step", "Metrics", "Kind", "Size", "Signature", "Served by", "Read by",
          "Registered"]), rows))),
    h("section", { class: "card", testid: "promotions-section" }, h("h2", {}, "Promotions, newest first"),
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "promotions-table" },
        head(["Decided", "Decision", "Version", "Job"]), promotions))));
}
