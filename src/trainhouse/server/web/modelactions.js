// What the Models pages act with, each asked first in one dialog of the page: register a job's
// saved model or one of its checkpoints as a version, point an alias at a version, delete a
// version, start a service on a version (or an alias of it) and stop a service. Shown only to
// the roles the server lets act (the server decides again): members on their own models,
// admins (and anyone, auth off) on every one; members and admins start services; a service's
// owner or an admin stops it. Everything the page writes (names, the server's messages) goes in
// as text.
import { api, h } from "./core.js";

const enc = encodeURIComponent;
const JSON_HEADERS = { "Content-Type": "application/json" };

/** May `me` change the model (register versions of it, move its aliases, delete versions)? */
export function mayChange(me, model) {
  if (!me) return false;
  if (me.role === "open" || me.role === "admin") return true;
  return me.role === "member" && (!model || model.owner === me.name);
}

/** May `me` start a service (members and admins; anyone, auth off)? */
export const mayServe = (me) => Boolean(me) && ["open", "admin", "member"].includes(me.role);

/** May `me` stop the service (an admin, anyone auth off, or its owner)? */
export const mayStop = (me, service) => Boolean(me) && (me.role === "open" || me.role === "admin" ||
  (me.role === "member" && me.name === service.owner));

/** "x:float32[B,1,8,8] y:int64[B]" as a signature's inputs; throws on what is not one. */
export function parseInputs(text) {
  return text.trim().split(/\s+/).filter(Boolean).map((one) => {
    const m = /^([A-Za-z_][A-Za-z0-9_]*):([a-z0-9]+)\[([^\]]*)\]$/.exec(one);
    if (!m) throw new Error(`an input is NAME:DTYPE[B,d1,...] (e.g. x:float32[B,1,8,8]), not ${one.slice(0, 80)}`);
    const dims = m[3].split(",").map((d) => d.trim());
    if (dims[0] !== "B") throw new Error(`input ${m[1]}: dimension 0 must be B (the batch)`);
    return { name: m[1], dtype: m[2], shape: dims.map((d, i) => (i === 0 ? null : Number(d))) };
  });
}

/** The page's dialog: one question at a time, with its fields, a confirm and a cancel button,
 * and the line that says how the last action went. `done` runs after an action (a redraw). */
export class ModelDialog {
  constructor(done) {
    this.done = done;
    this.box = h("div", { class: "confirm model-dialog", testid: "model-dialog", hidden: true, role: "dialog",
      onkeydown: (e) => { if (e.key === "Escape") this.close(); } }); // Escape cancels, as Cancel does
    this.message = h("span", { class: "muted", testid: "model-message" }, "");
  }

  get open() {
    return !this.box.hidden;
  }

  close() {
    this.box.hidden = true;
    this.box.replaceChildren();
  }

  /** Ask `question` (nodes, updated by `fields`' input events through `say`), then run `act`. */
  ask({ fields = [], say, confirm, run, cancel = "Cancel", danger = false }) {
    const question = h("span", { testid: "model-dialog-question" });
    const update = () => question.replaceChildren(...[say()].flat());
    for (const f of fields) f.addEventListener("input", update);
    const yes = h("button", { class: danger ? "danger" : null, testid: "model-dialog-confirm",
      onclick: () => this.run(run) }, confirm);
    const no = h("button", { testid: "model-dialog-cancel", onclick: () => this.close() }, cancel);
    update();
    this.box.replaceChildren(...fields, question, yes, no);
    this.box.hidden = false;
    this.message.textContent = "";
    (fields[0] || yes).focus();
  }

  async run(act) {
    this.message.className = "muted";
    this.message.textContent = "working…";
    try {
      const said = await act();
      this.close();
      this.message.textContent = said;
    } catch (err) {
      this.message.className = "error";
      this.message.textContent = `refused: ${err.message}`;
    }
    this.done();
  }
}

const field = (testid, label, attrs = {}) =>
  h("input", { type: "text", testid, "aria-label": label, placeholder: label, ...attrs });

/** Register a job's saved model (or, with a loader, its checkpoint) as a new version of `name`
 * (asked for too when `name` is null: a new model). */
export function askRegister(dialog, name) {
  const nameIn = name === null ? field("register-name", "model name", { size: 14 }) : null;
  const job = field("register-job", "job id", { size: 7, inputmode: "numeric" });
  const step = field("register-step", "step (newest)", { size: 9, inputmode: "numeric" });
  const loader = field("register-loader", "loader file.py:function (a checkpoint)", { size: 26 });
  const inputs = field("register-inputs", "inputs x:float32[B,1,8,8] (with a loader)", { size: 26 });
  const model = () => (nameIn ? nameIn.value.trim() : name);
  const what = () => {
    const at = step.value.trim() ? `step ${step.value.trim()}` : "its newest";
    return loader.value.trim() ? `checkpoint (${at}), rebuilt by ${loader.value.trim()},` : `saved model (${at})`;
  };
  dialog.ask({
    fields: [nameIn, job, step, loader, inputs].filter(Boolean),
    say: () => `Register job #${job.value.trim() || "?"}'s ${what()} as a new version of ${model() || "?"}?`,
    confirm: "Yes, register it",
    run: async () => {
      const body = { job: Number(job.value.trim()) };
      if (!job.value.trim() || !Number.isInteger(body.job)) throw new Error("a job id is a number");
      if (step.value.trim()) body.step = Number(step.value.trim());
      if (loader.value.trim()) body.loader = loader.value.trim();
      if (inputs.value.trim()) body.inputs = parseInputs(inputs.value);
      const made = await api(`/models/${enc(model())}/versions`, { method: "POST", headers: JSON_HEADERS,
        body: JSON.stringify(body) });
      return `registered ${made.model} version ${made.version}`;
    },
  });
}

/** Point an alias (typed) at `version`: made, or moved from the version it names now. */
export function askAlias(dialog, model, version) {
  const alias = field("alias-name", "alias (prod, staging, ...)", { size: 14 });
  dialog.ask({
    fields: [alias],
    say: () => {
      const a = alias.value.trim();
      const now = (model.aliases || {})[a];
      const from = now === undefined ? "" : now === version.version ? " (it names it already)" : ` (moving it from version ${now})`;
      return `Point ${a || "?"} of ${model.name} at version ${version.version}${from}?`;
    },
    confirm: "Yes, point it",
    run: async () => {
      const a = alias.value.trim();
      await api(`/models/${enc(model.name)}/aliases/${enc(a)}`, { method: "PUT", headers: JSON_HEADERS,
        body: JSON.stringify({ version: version.version }) });
      return `${a} → version ${version.version}`;
    },
  });
}

/** Delete `version` and its files (the server refuses while an alias names it or a service
 * uses it, and says which). */
export function askDelete(dialog, model, version) {
  dialog.ask({
    say: () => `Delete version ${version.version} of ${model.name} and its files? This cannot be undone.`,
    confirm: "Yes, delete it",
    cancel: "Keep it",
    danger: true,
    run: async () => {
      await api(`/models/${enc(model.name)}/versions/${version.version}`, { method: "DELETE" });
      return `deleted version ${version.version}`;
    },
  });
}

/** Start a service on `version`, or on an alias that names it (the service then follows it). */
export function askServe(dialog, model, version) {
  const name = field("serve-name", "service name", { size: 14, value: model.name });
  const ref = h("select", { testid: "serve-ref", "aria-label": "what it follows" },
    h("option", { value: String(version.version) }, `version ${version.version}`),
    version.aliases.map((a) => h("option", { value: a }, `${a} (follows the alias)`)));
  const replicas = h("input", { type: "number", min: "1", max: "64", value: "1", testid: "serve-replicas",
    "aria-label": "replicas", style: "width: 4em" });
  ref.addEventListener("change", () => name.dispatchEvent(new Event("input")));
  dialog.ask({
    fields: [name, ref, replicas],
    say: () => `Start service ${name.value.trim() || "?"} serving ${model.name}@${ref.value} with ` +
      `${replicas.value || 1} replica(s)?`,
    confirm: "Yes, start it",
    run: async () => {
      const body = { model: model.name, ref: ref.value, name: name.value.trim() || null,
        replicas: Number(replicas.value || 1) };
      const s = await api("/services", { method: "POST", headers: JSON_HEADERS, body: JSON.stringify(body) });
      return `service ${s.name} ${s.state}`;
    },
  });
}

/** Stop `service` (its replicas end; predictions get 503). */
export function askStop(dialog, service) {
  dialog.ask({
    say: () => `Stop service ${service.name}? Its replicas end; predictions get 503.`,
    confirm: "Yes, stop it",
    cancel: "Keep serving",
    danger: true,
    run: async () => {
      const s = await api(`/services/${enc(service.name)}/stop`, { method: "POST" });
      return `service ${s.name} ${s.state}`;
    },
  });
}
