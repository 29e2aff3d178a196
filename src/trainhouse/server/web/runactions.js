// The job list's row actions (#/jobs): a row's "⋯" opens a panel above the table to tag the
// job, move it to another project, archive it (or bring it back) and delete it (asked first).
// Who may change the job, as the server decides: an admin (or anyone, auth off) or its owner;
// a viewer, or a member on another's job, gets no "⋯" at all. Every action is the REST call
// the CLI makes; what the server refuses is shown with its reason.
import { TERMINAL, api, h } from "./core.js";

/** Whether ``me`` (``GET /whoami``) may change ``job`` (the rule of ``writable_job``). */
export function mayChange(me, job) {
  if (!me) return false;
  return me.role === "open" || me.role === "admin" || (me.role === "member" && me.name === job.owner);
}

const send = (method, body) => ({ method, headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });

/** The panel: ``open(job)`` shows a job's actions, ``close()`` hides them; ``changed()`` is
 * called after each action the server took (the list refreshes). */
export function actionPanel(changed) {
  const title = h("strong", { testid: "row-panel-title" }, "");
  const msg = h("span", { class: "muted", testid: "row-panel-message" }, "");
  const body = h("div", { class: "row-panel-body" });
  const closeBtn = h("button", { class: "plain", testid: "row-panel-close", "aria-label": "close", title: "close",
    onclick: () => close() }, "×");
  const el = h("div", { class: "row-panel card", testid: "row-panel", hidden: true,
    onkeydown: (e) => { if (e.key === "Escape") close(); } }, // Escape closes it, as × does
    h("div", { class: "row-panel-head" }, title, msg, h("span", { class: "spacer" }), closeBtn), body);
  let current = null;

  function close() {
    current = null;
    el.hidden = true;
    body.replaceChildren();
  }

  async function run(job, what, call, after) {
    msg.className = "muted";
    msg.textContent = `${what}…`;
    try {
      const out = await call();
      if (current !== job.id) return;
      msg.textContent = `${what}: done`;
      if (after) after(out);
    } catch (err) {
      if (current !== job.id) return;
      msg.className = "error";
      msg.textContent = `${what} refused: ${err.message}`;
    }
    changed();
  }

  function open(job) {
    current = job.id;
    el.hidden = false;
    title.textContent = `Job ${job.id} · ${job.name}`;
    msg.className = "muted";
    msg.textContent = "";
    const tags = h("span", { class: "tags", testid: "row-tags" });
    const showTags = (list) => tags.replaceChildren(...(list || []).map((t) => h("span", { class: "tag", testid: "row-tag" }, t)));
    showTags(job.tags);
    const tagInput = h("input", { type: "text", placeholder: "a tag", testid: "row-tag-input", "aria-label": `a tag for job ${job.id}`,
      onkeydown: (e) => { if (e.key === "Enter") addTag(); } });
    const addTag = () => {
      const tag = tagInput.value.trim();
      if (!tag) return;
      run(job, `tag ${tag}`, () => api(`/jobs/${job.id}/tags`, send("POST", { add: [tag] })), (out) => {
        tagInput.value = "";
        showTags(out.tags);
      });
    };
    const project = h("input", { type: "text", value: job.project || "default", testid: "row-project-input",
      "aria-label": `the project of job ${job.id}`, onkeydown: (e) => { if (e.key === "Enter") move(); } });
    const move = () => {
      const to = project.value.trim();
      if (!to) return;
      run(job, `move to ${to}`, () => api(`/jobs/${job.id}/project`, send("PUT", { project: to })));
    };
    const lines = [
      h("div", { class: "row-panel-line" }, h("span", { class: "muted" }, "tags "), tags, tagInput,
        h("button", { testid: "row-tag-add", onclick: addTag }, "Add tag")),
      h("div", { class: "row-panel-line" }, h("span", { class: "muted" }, "project "), project,
        h("button", { testid: "row-project-move", onclick: move }, "Move")),
    ];
    if (TERMINAL.has(job.state)) {
      const archived = Boolean(job.archived);
      const archiveBtn = h("button", { testid: "row-archive", onclick: () => run(job, archived ? "unarchive" : "archive",
        () => api(`/jobs/${job.id}/archive`, send("POST", { archived: !archived })), () => body.replaceChildren()) },
      archived ? "Unarchive" : "Archive");
      const deleteBtn = h("button", { class: "danger", testid: "row-delete",
        onclick: () => { sure.hidden = false; deleteBtn.hidden = true; } }, "Delete…");
      const sure = h("span", { class: "confirm", testid: "row-delete-dialog", hidden: true },
        `Delete job ${job.id} for good: its logs, checkpoints, metrics and records? `,
        h("button", { class: "danger small", testid: "row-delete-confirm", onclick: () => {
          sure.hidden = true;
          run(job, "delete", () => api(`/jobs/${job.id}`, { method: "DELETE" }), () => body.replaceChildren());
        } }, "Yes, delete it"),
        h("button", { class: "small", testid: "row-delete-abort", onclick: () => { sure.hidden = true; deleteBtn.hidden = false; } }, "No, keep it"));
      lines.push(h("div", { class: "row-panel-line" }, archiveBtn, deleteBtn, sure));
    } else {
      lines.push(h("div", { class: "row-panel-line muted", testid: "row-not-ended" },
        `Archive and delete: once the job has ended (it is ${job.state}).`));
    }
    body.replaceChildren(...lines);
    tagInput.focus();
  }

  return { el, open, close, get current() { return current; } };
}
