// Flows (trainhouse submit flow.yaml): #/flows (every flow: its state, its steps' states) and
// #/flows/<id> (its steps upstream-first: each one's job, state, progress, what it waits for and
// reads, why it waits or ended; Cancel and Resume for its owner). A job's page shows its flow,
// the jobs it waits for, its inputs and its promotion with jobFlowFacts(job).
// Everything a flow shows (names, reasons, decisions) goes into the page as text.
import { ApiError, POLL_MS, api, badge, h, kv, progressCell, timeCell } from "./core.js";
import { modelHref } from "./models.js";

const head = (cols) => h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c))));
const ENDED = new Set(["COMPLETED", "FAILED", "CANCELED"]);
export const flowHref = (id) => `#/flows/${id}`;

/** "2/3 done": the steps that completed, of all. */
function doneText(flow) {
  const done = flow.steps.filter((s) => s.state === "COMPLETED").length;
  return `${done}/${flow.steps.length} done`;
}

/** A step's state as a badge ("deleted" when its job is gone). */
function stepBadge(step, testid) {
  return step.state === null ? h("span", { class: "badge", testid }, "deleted") : badge(step.state, testid);
}

export function flowsPage(view) {
  const rows = h("tbody", { testid: "flow-rows" });
  const count = h("span", { class: "muted", testid: "flow-count" }, "");
  const mine = h("input", { type: "checkbox", testid: "flows-mine", onchange: () => { lastRows = ""; poller.now(); } });
  let lastRows = "";
  const poller = view.poll(async () => {
    const data = await api(`/flows?mine=${mine.checked}&limit=100`);
    if (!view.alive) return false;
    count.textContent = `${data.total} flow${data.total === 1 ? "" : "s"}` +
      (data.total > data.flows.length ? ` (the newest ${data.flows.length} shown)` : "");
    const key = JSON.stringify([data.flows, Math.floor(Date.now() / 30000)]);
    if (key === lastRows) return true;
    lastRows = key;
    rows.replaceChildren(...(data.flows.length ? data.flows.map((f) => h("tr", { testid: "flow-row", "data-flow-id": f.id, "data-state": f.state },
      h("td", { class: "num" }, h("a", { href: flowHref(f.id) }, String(f.id))),
      h("td", {}, h("a", { href: flowHref(f.id), testid: "flow-link" }, f.name)),
      h("td", {}, f.owner),
      h("td", {}, badge(f.state, "flow-state")),
      h("td", { class: "flow-steps", testid: "flow-steps" },
        h("span", { class: "num", testid: "flow-done" }, doneText(f)), " ",
        f.steps.map((s) => h("span", { class: "flow-step", testid: "flow-step", "data-step": s.name, title: s.reason || "" },
          s.name, " ", stepBadge(s)))),
      h("td", {}, timeCell(f.created_at))))
      : [h("tr", { class: "empty" }, h("td", { colspan: "6" },
        mine.checked ? "You have no flows." : "No flows yet. Submit one: trainhouse submit flow.yaml"))]));
    return true;
  }, POLL_MS);
  return h("section", { class: "page flows" },
    h("div", { class: "toolbar" }, h("h1", {}, "Flows"), count, h("span", { class: "spacer" }),
      h("label", { class: "small" }, mine, " only mine")),
    h("section", { class: "card" }, h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "flows-table" },
      head(["ID", "Name", "Owner", "State", "Steps", "Submitted"]), rows))));
}

/** Who may cancel or resume a flow, as the server decides: an admin (or anyone, auth off), or
 * the flow's owner. */
function mayChange(me, flow) {
  if (!me) return false;
  return me.role === "open" || me.role === "admin" || (me.role === "member" && me.name === flow.owner);
}

function stepRow(flow, step, i) {
  const jobOf = (name) => flow.jobs[name];
  const link = (name) => (jobOf(name) === undefined ? name
    : h("a", { href: `#/jobs/${jobOf(name)}`, title: `job ${jobOf(name)}` }, name));
  const inputs = Object.entries(step.inputs || {});
  // why it waits, or why it ended as it did
  const why = step.state === null || step.state === "QUEUED" || step.state === "FAILED" || step.state === "CANCELED";
  return h("tr", { testid: "step-row", "data-step": step.name, "data-state": step.state ?? "deleted", "data-job-id": step.job_id },
    h("td", { class: "num" }, String(i + 1)),
    h("td", { testid: "step-name" }, step.name),
    h("td", {}, step.state === null ? h("span", { class: "muted" }, `#${step.job_id} (deleted)`)
      : [h("a", { href: `#/jobs/${step.job_id}`, testid: "step-job" }, `#${step.job_id}`),
        step.job_name ? [" ", h("span", { class: "muted" }, step.job_name)] : null]),
    h("td", {}, stepBadge(step, "step-state")),
    h("td", { testid: "step-progress" }, progressCell(step)),
    h("td", { testid: "step-after" }, step.after.length
      ? step.after.flatMap((name, k) => [k ? ", " : null, link(name)]) : "—"),
    h("td", { testid: "step-inputs" }, inputs.length
      ? inputs.flatMap(([key, name], k) => [k ? ", " : null, `${key} = `, link(name)]) : "—"),
    h("td", { class: "reason", testid: "step-reason" }, why && step.reason ? step.reason : ""));
}

export function flowPage(view, flowId) {
  const title = h("h1", {}, `Flow ${flowId}`);
  const state = badge("…", "flow-state");
  const summary = h("dl", { class: "summary", testid: "flow-summary" });
  const rows = h("tbody", { testid: "step-rows" });
  let flow = null;
  let me = null;
  let busy = false;
  let lastRows = "";

  // Cancel and Resume: the owner (and admins); asked first
  const message = h("span", { class: "muted", testid: "flow-message" }, "");
  const cancelBtn = h("button", { class: "danger", testid: "flow-cancel", hidden: true,
    onclick: () => { cancelDialog.hidden = false; render(); } }, "Cancel flow");
  const cancelDialog = h("span", { class: "confirm", testid: "flow-cancel-dialog", hidden: true },
    `Cancel flow ${flowId}? Every step that has not ended is canceled. `,
    h("button", { class: "danger", testid: "flow-cancel-confirm", onclick: () => act("cancel") }, "Yes, cancel it"),
    h("button", { testid: "flow-cancel-abort", onclick: () => { cancelDialog.hidden = true; render(); } }, "Keep running"));
  const resumeBtn = h("button", { testid: "flow-resume", hidden: true,
    title: "Run again the steps that failed or were canceled; completed steps stay",
    onclick: () => { resumeDialog.hidden = false; render(); } }, "Resume");
  const resumeDialog = h("span", { class: "confirm", testid: "flow-resume-dialog", hidden: true },
    `Resume flow ${flowId}? Its failed and canceled steps run again; completed steps stay. `,
    h("button", { testid: "flow-resume-confirm", onclick: () => act("resume") }, "Yes, resume it"),
    h("button", { testid: "flow-resume-abort", onclick: () => { resumeDialog.hidden = true; render(); } }, "Back"));

  async function act(what) {
    cancelDialog.hidden = true;
    resumeDialog.hidden = true;
    busy = true;
    message.className = "muted";
    message.textContent = what === "cancel" ? "canceling…" : "resuming…";
    render();
    try {
      flow = await api(`/flows/${flowId}/${what}`, { method: "POST" });
      message.textContent = what === "cancel" ? "cancel requested" : "queued again";
    } catch (err) {
      message.className = "error";
      message.textContent = `${what} refused: ${err.message}`;
    }
    busy = false;
    lastRows = "";
    render();
    view.wake();
  }

  function render() {
    if (!flow) return;
    document.title = `${flow.name} · flow ${flowId} · trainhouse`;
    title.replaceChildren(`Flow ${flow.id}: `, h("span", { testid: "flow-name" }, flow.name));
    state.textContent = flow.state;
    state.className = `badge state-${flow.state.toLowerCase()}`;
    const may = mayChange(me, flow);
    const ended = ENDED.has(flow.state);
    if (ended) cancelDialog.hidden = true;
    if (!(flow.state === "FAILED" || flow.state === "CANCELED")) resumeDialog.hidden = true;
    const asking = !cancelDialog.hidden || !resumeDialog.hidden;
    cancelBtn.hidden = !may || ended || asking;
    resumeBtn.hidden = !may || !(flow.state === "FAILED" || flow.state === "CANCELED") || asking;
    cancelBtn.disabled = resumeBtn.disabled = busy;
    summary.replaceChildren(
      ...kv("Owner", flow.owner, "flow-owner"),
      ...kv("Steps", doneText(flow), "flow-done"),
      ...kv("Submitted", timeCell(flow.created_at)));
    const key = JSON.stringify([flow.steps, flow.jobs, Math.floor(Date.now() / 30000)]);
    if (key === lastRows) return;
    lastRows = key;
    rows.replaceChildren(...flow.steps.map((s, i) => stepRow(flow, s, i)));
  }

  const root = h("section", { class: "page flow" },
    h("div", { class: "job-head" },
      h("div", { class: "title-line" }, h("a", { href: "#/flows" }, "Flows"), title, state),
      h("div", { class: "actions" }, resumeBtn, resumeDialog, cancelBtn, cancelDialog, message)),
    h("section", { class: "card" }, summary),
    h("section", { class: "card" }, h("h2", {}, "Steps, upstream first"),
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "steps-table" },
        head(["#", "Step", "Job", "State", "Progress", "Waits for", "Reads", "Why"]), rows))));

  view.poll(async () => {
    try {
      const [found, who] = await Promise.all([api(`/flows/${flowId}`), me ? Promise.resolve(me) : api("/whoami")]);
      flow = found;
      me = who;
    } catch (err) {
      if (err instanceof ApiError && (err.status === 404 || err.status === 403)) {
        root.replaceChildren(h("h1", {}, `Flow ${flowId}`), h("p", { class: "error", testid: "not-found" }, err.message),
          h("p", {}, h("a", { href: "#/flows" }, "Back to the flows")));
        return false;
      }
      throw err;
    }
    if (!view.alive) return false;
    render();
    return true; // an ended flow may be resumed (here or with the CLI): keep watching
  }, POLL_MS);
  return root;
}

// -- a job's page: its flow, the jobs it waits for, its inputs, its promotion ------------------

function upstreamsOf(job) {
  const ups = job.after || [];
  if (!ups.length) return null;
  return h("span", { testid: "job-after" }, ups.flatMap((u, i) => [i ? ", " : null,
    h("span", { testid: "job-after-item", "data-job-id": u.job_id },
      h("a", { href: `#/jobs/${u.job_id}`, testid: "job-after-link" }, `#${u.job_id}`), " ",
      u.state === null ? h("span", { class: "badge", testid: "job-after-state" }, "deleted") : badge(u.state, "job-after-state"),
      u.when === "ended" ? h("span", { class: "muted" }, " (any end)") : null)]));
}

function inputsOf(job) {
  const resolved = job.inputs || [];
  const asked = Object.entries((job.spec && job.spec.inputs) || {});
  const keys = new Set(resolved.map((i) => i.key));
  const pending = asked.filter(([key]) => !keys.has(key));
  if (!resolved.length && !pending.length) return null;
  return h("span", { testid: "job-inputs" }, [
    ...resolved.map((i) => h("span", { testid: "job-input", "data-key": i.key },
      `${i.key} = `, h("a", { href: modelHref(i.model, i.version), testid: "job-input-ref" }, `${i.model}@${i.version}`),
      i.ref !== `${i.model}@${i.version}` ? h("span", { class: "muted" }, ` (${i.ref})`) : null)),
    ...pending.map(([key, ref]) => h("span", { testid: "job-input", "data-key": key },
      `${key} = ${ref}`, h("span", { class: "muted" }, " (resolved when it starts)"))),
  ].flatMap((el, i) => [i ? ", " : null, el]));
}

function promotionOf(job) {
  const p = job.promotion;
  if (!p) return null;
  const better = p.mode === "min" ? "lower" : "higher";
  const text = p.promoted === null || p.promoted === undefined
    ? `pending: ${p.model ? `${p.model}@` : ""}${p.alias} moves to its version if its ${p.metric} is ${better} than the current one's (decided when it completes)`
    : p.decision || (p.promoted ? `promoted to ${p.alias}` : `not promoted to ${p.alias}`);
  return h("span", { testid: "job-promotion", "data-promoted": p.promoted === null ? "pending" : String(p.promoted) },
    text,
    p.model && p.version !== null && p.version !== undefined
      ? [" · ", h("a", { href: modelHref(p.model, p.version), testid: "job-promotion-model" }, `${p.model}@${p.version}`)] : null,
    p.decided_at ? [" · ", timeCell(p.decided_at)] : null);
}

/** A job's part in a flow and a registry, for its page's summary (kv entries). */
export function jobFlowFacts(job) {
  const out = [];
  if (job.flow_id !== null && job.flow_id !== undefined) {
    out.push(...kv("Flow", h("span", {},
      h("a", { href: flowHref(job.flow_id), testid: "job-flow-link" }, `flow ${job.flow_id}`),
      job.flow_step ? [", step ", h("span", { testid: "job-flow-step" }, job.flow_step)] : null)));
  }
  const ups = upstreamsOf(job);
  if (ups) out.push(...kv("Waits for", ups));
  const inputs = inputsOf(job);
  if (inputs) out.push(...kv("Inputs", inputs));
  const promotion = promotionOf(job);
  if (promotion) out.push(...kv("Promotion", promotion));
  return out;
}
