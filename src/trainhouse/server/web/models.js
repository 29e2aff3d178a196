// The model registry: #/models (every model) and #/models/<name> (its versions: aliases, the
// job that made each one, its step, metrics, files and signature, the services that serve it,
// the jobs that read it as an input; ?version=N marks that version's row; then what jobs'
// promote: decided about its versions, newest first). The roles the server lets act register
// versions, move aliases, delete versions and start and stop services here, each asked first
// (modelactions.js).
import { POLL_MS, api, fmtBytes, fmtNum, h, timeCell } from "./core.js";
import { ModelDialog, askAlias, askDelete, askRegister, askServe, askStop, mayChange, mayServe, mayStop }
  from "./modelactions.js";

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

/** Inputs → outputs; a checkpoint's inputs are what its registration declared (none: it says
 * so), its outputs what its replicas reported once they served it. */
function signatureCell(sig) {
  const ins = (sig.inputs || []).map(tensorText).join("; ");
  const outs = (sig.outputs || []).map(tensorText).join("; ");
  return h("code", { testid: "version-signature" }, `${ins || "(inputs not declared)"} → ${outs || "(outputs known once served)"}`);
}

export function modelsPage(view) {
  const rows = h("tbody", { testid: "model-rows" });
  const dialog = new ModelDialog(() => view.wake());
  const registerBtn = h("button", { testid: "model-register", hidden: true,
    onclick: () => askRegister(dialog, null) }, "Register a model…");
  let me = null;
  view.poll(async () => {
    const [{ models }, who] = await Promise.all([api("/models"), me ? Promise.resolve(me) : api("/whoami")]);
    me = who;
    registerBtn.hidden = !mayServe(me); // members and admins (a new model is theirs)
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
    h("div", { class: "toolbar" }, h("h1", {}, "Models"), registerBtn, dialog.message),
    dialog.box,
    h("section", { class: "card" }, h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "models-table" },
      head(["Name", "Versions", "Latest", "Aliases", "Owner", "Created"]), rows))));
}

/** The services of `model` that answer with `version` now (or will: starting on it). */
function servedBy(services, model, version, stop) {
  const found = services.filter((s) => s.model === model && (s.versions.includes(version) ||
    (!s.versions.length && s.target_version === version && (s.state === "queued" || s.state === "starting"))));
  if (!found.length) return "—";
  return found.flatMap((s, i) => [i ? ", " : null, h("a", { href: `#/services/${encodeURIComponent(s.name)}`,
    testid: "version-service", title: s.state }, s.name), s.versions.includes(version) ? null : " (starting)",
  stop(s)]);
}

export function modelPage(view, name, selected) {
  const rows = h("tbody", { testid: "version-rows" });
  const title = h("h1", {}, name);
  const owner = h("span", { class: "muted", testid: "model-owner" });
  const promotions = h("tbody", { testid: "promotion-rows" });
  const dialog = new ModelDialog(() => { drawn = ""; view.wake(); });
  let model = null;
  const registerBtn = h("button", { testid: "model-register", hidden: true,
    onclick: () => askRegister(dialog, name) }, "Register a version…");
  let scrolled = false;
  let me = null;
  let drawn = ""; // what the rows show: redrawn when it changes, or every half minute ("ago")
  let drawnAt = 0;

  const small = (testid, label, onclick, danger) =>
    h("button", { class: `small${danger ? " danger" : ""}`, testid, onclick }, label);
  const stopButton = (s) => (mayStop(me, s) && !["stopping", "stopped", "failed", "lost"].includes(s.state)
    ? [" ", small("version-service-stop", "Stop…", () => askStop(dialog, s), true)] : null);
  const actions = (v) => {
    const change = mayChange(me, model);
    const serve = mayServe(me);
    if (!change && !serve) return h("td", {});
    return h("td", { class: "actions", testid: "version-actions" },
      change ? small("version-alias", "Alias…", () => askAlias(dialog, model, v)) : null,
      serve ? small("version-serve", "Serve…", () => askServe(dialog, model, v)) : null,
      change ? small("version-delete", "Delete…", () => askDelete(dialog, model, v), true) : null);
  };

  view.poll(async () => {
    const [data, { services }, who] = await Promise.all([api(`/models/${encodeURIComponent(name)}`), api("/services"),
      me ? Promise.resolve(me) : api("/whoami")]);
    me = who;
    model = data.model;
    document.title = `${name} · trainhouse`;
    owner.textContent = `owner ${data.model.owner} · aliases ${aliasText(data.model.aliases)}`;
    registerBtn.hidden = !mayChange(me, model);
    promotions.replaceChildren(...promotionRows(name, data.promotions || []));
    const key = JSON.stringify([data.model, data.versions, data.readers,
      services.map((s) => [s.name, s.state, s.owner, s.versions, s.target_version]), me]);
    if (key === drawn && Date.now() - drawnAt < 30000) return true;
    drawn = key;
    drawnAt = Date.now();
    rows.replaceChildren(...[...data.versions].reverse().map((v) => h("tr", { testid: "version-row", "data-version": v.version,
      class: String(v.version) === selected ? "selected" : null },
      h("td", { class: "num" }, String(v.version)),
      h("td", { testid: "version-aliases" }, v.aliases.length ? v.aliases.join(", ") : "—"),
      h("td", {}, v.job_id === null ? "deleted" : h("a", { href: `#/jobs/${v.job_id}`, testid: "version-job" },
        `job #${v.job_id}`)),
      h("td", { class: "num" }, String(v.step)),
      h("td", { class: "wrap", testid: "version-metrics" }, metricText(v.metrics)),
      h("td", {}, v.kind),
      h("td", { class: "num" }, fmtBytes(v.size)),
      h("td", { class: "wrap" }, signatureCell(v.signature)),
      h("td", { testid: "version-services" }, servedBy(services, name, v.version, stopButton)),
      h("td", { testid: "version-readers" }, jobLinks((data.readers || {})[String(v.version)], "version-reader")),
      h("td", {}, timeCell(v.created_at)),
      actions(v))));
    const mark = rows.querySelector("tr.selected");
    if (mark && !scrolled) mark.scrollIntoView({ block: "nearest" });
    scrolled = scrolled || Boolean(mark);
  }, POLL_MS);
  return h("section", { class: "page model" },
    h("div", { class: "toolbar" }, h("a", { href: "#/models" }, "Models"), title, owner, registerBtn, dialog.message),
    dialog.box,
    h("section", { class: "card" }, h("h2", {}, "Versions, newest first"),
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "versions-table" },
        head(["Version", "Aliases", "Made by", "Step", "Metrics", "Kind", "Size", "Signature", "Served by", "Read by",
          "Registered", ""]), rows))),
    h("section", { class: "card", testid: "promotions-section" }, h("h2", {}, "Promotions, newest first"),
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "promotions-table" },
        head(["Decided", "Decision", "Version", "Job"]), promotions))));
}
