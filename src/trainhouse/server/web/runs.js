// Reading experiments: a job's tags and note (markdown), the hparams a run used, and compare's
// table of the selected runs' hparams with the differing ones highlighted.
import { api, h } from "./core.js";

/** The hparams a run used: what its SDK reported, else the spec's. */
export function usedHparams(job) {
  return job.hparams ?? (job.spec && job.spec.hparams) ?? {};
}

/** {"optim": {"lr": 1}} -> {"optim.lr": 1} (nested keys joined with dots). */
export function flatten(obj, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(obj || {})) {
    if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) flatten(v, `${prefix}${k}.`, out);
    else out[`${prefix}${k}`] = v;
  }
  return out;
}

export function fmtCell(v) {
  if (v === undefined) return "—";
  if (v === null) return "null";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : Number(v.toPrecision(4)).toString();
  return typeof v === "string" ? v : JSON.stringify(v);
}

// ------------------------------------------------------------------------------- markdown
// A small, safe subset: headings, paragraphs, lists, code blocks, `code`, **bold**, *italic*
// and links to http(s) addresses. Text only ever becomes text nodes: no HTML passes through.
function inline(text) {
  const out = [];
  const re = /(`[^`]+`|\*\*[^*]+\*\*|\*[^*\s][^*]*\*|\[[^\]]+\]\((https?:\/\/[^)\s]+)\))/g;
  let last = 0;
  for (const m of text.matchAll(re)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    const t = m[0];
    if (t.startsWith("`")) out.push(h("code", {}, t.slice(1, -1)));
    else if (t.startsWith("**")) out.push(h("strong", {}, t.slice(2, -2)));
    else if (t.startsWith("*")) out.push(h("em", {}, t.slice(1, -1)));
    else out.push(h("a", { href: m[2], rel: "noopener noreferrer", target: "_blank" }, t.slice(1, t.indexOf("]"))));
    last = m.index + t.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

export function markdown(text) {
  const root = h("div", { class: "markdown", testid: "note-view" });
  const lines = (text || "").split("\n");
  let list = null;
  let para = [];
  const flush = () => {
    if (para.length) root.append(h("p", {}, inline(para.join(" "))));
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (line.startsWith("```")) {
      flush();
      list = null;
      const code = [];
      for (i += 1; i < lines.length && !lines[i].startsWith("```"); i++) code.push(lines[i]);
      root.append(h("pre", {}, h("code", {}, code.join("\n"))));
      continue;
    }
    const heading = /^(#{1,4})\s+(.*)$/.exec(line);
    const item = /^\s*[-*]\s+(.*)$/.exec(line);
    if (heading) {
      flush();
      list = null;
      root.append(h(`h${heading[1].length + 2}`, {}, inline(heading[2])));
    } else if (item) {
      flush();
      if (!list) root.append((list = h("ul", {})));
      list.append(h("li", {}, inline(item[1])));
    } else if (!line.trim()) {
      flush();
      list = null;
    } else {
      list = null;
      para.push(line.trim());
    }
  }
  flush();
  return root;
}

// ------------------------------------------------------------------------ tags and the note
/** The job page's card: tags (add, remove) and the note (view, edit, save). ``update(job)``
 * shows a new state of the job; edits in progress are left alone. */
export function experimentCard(jobId, onChange) {
  let job = null;
  let editing = false;
  const tagList = h("span", { class: "tags", testid: "job-tags" });
  const tagInput = h("input", { type: "text", placeholder: "add a tag", testid: "tag-input", "aria-label": "add a tag",
    onkeydown: (e) => { if (e.key === "Enter") addTag(); } });
  const tagMsg = h("span", { class: "error", testid: "tag-message" }, "");
  const project = h("span", { testid: "job-project" }, "");
  const noteView = h("div", { testid: "note-box" });
  const noteText = h("textarea", { rows: "8", testid: "note-input", "aria-label": "note (markdown)", hidden: true });
  const noteMsg = h("span", { class: "muted", testid: "note-message" }, "");
  const editBtn = h("button", { testid: "note-edit", onclick: () => {
    editing = true;
    noteText.value = (job && job.note) || "";
    render();
    noteText.focus();
  } }, "Edit note");
  const saveBtn = h("button", { testid: "note-save", hidden: true, onclick: () => saveNote() }, "Save");
  const cancelBtn = h("button", { testid: "note-cancel", hidden: true, onclick: () => { editing = false; render(); } }, "Cancel");
  const hp = h("div", { testid: "job-hparams" });

  async function changeTags(body) {
    tagMsg.textContent = "";
    try {
      const out = await api(`/jobs/${jobId}/tags`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      job = { ...job, tags: out.tags };
      render();
      onChange();
    } catch (err) {
      tagMsg.textContent = err.message;
    }
  }
  function addTag() {
    const tag = tagInput.value.trim();
    if (!tag) return;
    tagInput.value = "";
    changeTags({ add: [tag] });
  }
  async function saveNote() {
    noteMsg.textContent = "saving…";
    try {
      job = await api(`/jobs/${jobId}/note`, { method: "PUT", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ note: noteText.value }) });
      editing = false;
      noteMsg.textContent = "saved";
      render();
      onChange();
    } catch (err) {
      noteMsg.textContent = `not saved: ${err.message}`;
    }
  }
  function render() {
    if (!job) return;
    project.textContent = job.project || "default";
    tagList.replaceChildren(...(job.tags || []).map((t) => h("span", { class: "tag", testid: "tag" }, t,
      h("button", { class: "plain", title: `remove ${t}`, "aria-label": `remove tag ${t}`, testid: `tag-remove-${t}`,
        onclick: () => changeTags({ remove: [t] }) }, "×"))));
    noteText.hidden = saveBtn.hidden = cancelBtn.hidden = !editing;
    editBtn.hidden = editing;
    noteView.hidden = editing;
    noteView.replaceChildren(job.note ? markdown(job.note) : h("p", { class: "muted" }, "No note yet."));
    const used = flatten(usedHparams(job));
    const keys = Object.keys(used).sort();
    // replaceChildren writes a null as the text "null": only the nodes there are
    hp.replaceChildren(...[keys.length
      ? h("table", { class: "grid compact" }, h("tbody", {}, keys.map((k) => h("tr", {}, h("th", { testid: "hparam-name" }, k), h("td", { class: "mono" }, fmtCell(used[k]))))))
      : h("p", { class: "muted" }, "No hparams."),
    job.hparams ? null : h("p", { class: "muted small" }, "The spec's hparams: the run has not reported the ones it used.")].filter(Boolean));
  }
  const el = h("section", { class: "card", testid: "experiment-section" },
    h("div", { class: "card-head" }, h("h2", {}, "Experiment"), h("span", { class: "muted" }, "project "), project),
    h("div", { class: "tag-line" }, tagList, tagInput, h("button", { testid: "tag-add", onclick: addTag }, "Add"), tagMsg),
    h("div", { class: "experiment" },
      h("div", {}, h("h3", {}, "Hyperparameters"), hp),
      h("div", {}, h("div", { class: "card-head" }, h("h3", {}, "Note"), editBtn, saveBtn, cancelBtn, noteMsg), noteView, noteText)));
  return {
    el,
    update(next) {
      if (editing) {
        job = { ...next, note: job ? job.note : next.note };
        return;
      }
      job = next;
      render();
    },
  };
}

// --------------------------------------------------------------------------- compare's table
/** The selected runs' hparams side by side: a row per key, a column per job; the rows whose
 * values differ come first, highlighted. */
export function hparamsTable(jobs) {
  const flat = jobs.map((j) => flatten(usedHparams(j)));
  const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))];
  const differs = (k) => new Set(flat.map((f) => JSON.stringify(f[k]))).size > 1;
  keys.sort((a, b) => Number(differs(b)) - Number(differs(a)) || a.localeCompare(b));
  if (!keys.length) return h("p", { class: "muted", testid: "compare-hparams" }, "These jobs have no hparams.");
  return h("div", { class: "table-wrap" }, h("table", { class: "grid compact", testid: "compare-hparams" },
    h("thead", {}, h("tr", {}, h("th", {}, "hparam"), jobs.map((j) => h("th", {}, `#${j.id}`)))),
    h("tbody", {}, keys.map((k) => h("tr", { class: differs(k) ? "differs" : "", "data-key": k, testid: "hparam-row" },
      h("th", {}, k), flat.map((f) => h("td", { class: "mono" }, fmtCell(f[k]))))))));
}
