// Datasets (trainhouse datasets add NAME DIR|URL): #/datasets (every dataset: its versions, the
// newest one's size, owner) and #/datasets/<name>[?version=N] (its versions: files, size, digest,
// source, checksums, who added it, the jobs that pinned it, Remove; ?version=N lists that
// version's files from its manifest). A job's page shows its pins with jobDatasets(job).
// Everything a dataset shows (names, paths, sources, descriptions) goes into the page as text.
import { ApiError, POLL_MS, api, fmtBytes, h, timeCell } from "./core.js";

const MANIFEST_ROWS = 200; // the files a version's page lists (the manifest has them all)

const head = (cols) => h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c))));
export const datasetHref = (name, version) =>
  `#/datasets/${encodeURIComponent(name)}${version === null || version === undefined ? "" : `?version=${version}`}`;
const short = (digest) => String(digest || "").slice(0, 12);

export function datasetsPage(view) {
  const rows = h("tbody", { testid: "dataset-rows" });
  view.poll(async () => {
    const { datasets } = await api("/datasets");
    if (!view.alive) return false;
    rows.replaceChildren(...(datasets.length ? datasets.map((d) => h("tr", { testid: "dataset-row", "data-dataset": d.name },
      h("td", {}, h("a", { href: datasetHref(d.name), testid: "dataset-link" }, d.name)),
      h("td", { class: "num", testid: "dataset-versions" }, String(d.versions)),
      h("td", { class: "num", testid: "dataset-latest" }, d.latest === null ? "—" : String(d.latest)),
      h("td", { class: "num", testid: "dataset-size" }, fmtBytes(d.size)),
      h("td", {}, d.owner),
      h("td", {}, timeCell(d.created_at))))
      : [h("tr", { class: "empty" }, h("td", { colspan: "6" },
        "No datasets yet: trainhouse datasets add NAME DIR (or a URL) registers one."))]));
  }, POLL_MS);
  return h("section", { class: "page datasets" },
    h("div", { class: "toolbar" }, h("h1", {}, "Datasets"),
      h("span", { class: "muted small" }, "size: the newest version's")),
    h("section", { class: "card" }, h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "datasets-table" },
      head(["Name", "Versions", "Latest", "Size", "Owner", "Created"]), rows))));
}

/** Who may remove a version, as the server decides: an admin (or anyone, auth off), or the
 * dataset's owner. */
function mayRemove(me, dataset) {
  if (!me) return false;
  return me.role === "open" || me.role === "admin" || (me.role === "member" && me.name === dataset.owner);
}

function jobLinks(ids, testid) {
  if (!ids || !ids.length) return "—";
  return ids.flatMap((id, i) => [i ? ", " : null, h("a", { href: `#/jobs/${id}`, testid }, `#${id}`)]);
}

function manifestTable(m) {
  const shown = m.files.slice(0, MANIFEST_ROWS);
  return [
    h("p", { class: "muted small", testid: "manifest-count" }, `${m.files.length} file${m.files.length === 1 ? "" : "s"}` +
      (m.files.length > MANIFEST_ROWS ? `; the first ${MANIFEST_ROWS} by path` : "") + ` · manifest ${m.digest}`),
    h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "manifest-table" },
      head(["Path", "Size", "Digest"]),
      h("tbody", { testid: "manifest-rows" }, shown.map((f) => h("tr", { testid: "manifest-row", "data-path": f.path },
        h("td", { class: "mono", testid: "manifest-path" }, f.path),
        h("td", { class: "num" }, fmtBytes(f.size)),
        h("td", { class: "mono", title: `${f.algorithm}:${f.digest}` }, `${f.algorithm}:${short(f.digest)}`)))))),
  ];
}

export function datasetPage(view, name, selected) {
  const title = h("h1", {}, name);
  const owner = h("span", { class: "muted", testid: "dataset-owner" });
  const message = h("span", { class: "muted", testid: "dataset-message" }, "");
  const usedBy = h("p", { class: "muted", testid: "dataset-jobs" });
  const rows = h("tbody", { testid: "version-rows" });
  const filesTitle = h("h2", {}, selected ? `Files of ${name}@${selected}` : "Files");
  const files = h("div", { testid: "manifest" },
    h("p", { class: "muted" }, "Pick a version to list its files."));
  let me = null;
  let lastRows = "";
  let drawnAt = 0;
  let manifestFor = null; // the version whose manifest is on the page (a manifest never changes)

  async function remove(v) {
    const what = `remove ${v.ref}`;
    message.className = "muted";
    message.textContent = `${what}…`;
    try {
      await api(`/datasets/${encodeURIComponent(name)}/versions/${v.version}`, { method: "DELETE" });
      message.textContent = `${what}: done`;
    } catch (err) {
      message.className = "error";
      message.textContent = `${what} refused: ${err.message}`;
    }
    lastRows = "";
    view.wake();
  }

  const actions = (d, v) => {
    if (!mayRemove(me, d)) return h("td", {});
    const sure = h("span", { class: "confirm", testid: "version-remove-dialog", hidden: true,
      title: "The jobs that read it keep its record" }, `Remove ${v.ref}?`,
      h("button", { class: "danger small", testid: "version-remove-confirm", onclick: () => { sure.hidden = true; remove(v); } }, "Yes, remove it"),
      h("button", { class: "small", testid: "version-remove-abort",
        onclick: () => { sure.hidden = true; btn.hidden = false; } }, "Keep it"));
    const btn = h("button", { class: "small danger", testid: "version-remove",
      onclick: () => { btn.hidden = true; sure.hidden = false; } }, "Remove…");
    return h("td", { class: "actions" }, btn, sure);
  };

  function versionRow(d, v, jobs) {
    return h("tr", { testid: "version-row", "data-version": v.version,
      class: String(v.version) === selected ? "selected" : null },
    h("td", { class: "num" }, h("a", { href: datasetHref(name, v.version), testid: "version-select",
      title: "list its files" }, String(v.version))),
    h("td", { class: "num", testid: "version-files" }, String(v.files)),
    h("td", { class: "num", testid: "version-size" }, fmtBytes(v.size)),
    h("td", { class: "mono", testid: "version-digest", title: v.digest }, short(v.digest)),
    h("td", { class: "mono", testid: "version-source" }, v.source === null ? "(server)" : v.source),
    h("td", { testid: "version-checksums" }, v.checksums),
    h("td", { class: "reason", testid: "version-description" }, v.description || "—"),
    h("td", { testid: "version-created-by" }, v.created_by),
    h("td", {}, timeCell(v.created_at)),
    h("td", { testid: "version-jobs" }, jobs === null ? h("span", { class: "muted", title: "not asked for: an older version" }, "…") : jobLinks(jobs, "version-job")),
    actions(d, v));
  }

  async function showManifest(versions) {
    if (!selected) return;
    if (!versions.some((v) => String(v.version) === selected)) {
      if (manifestFor !== "gone") files.replaceChildren(h("p", { class: "error", testid: "manifest-missing" }, `${name} has no version ${selected}.`));
      manifestFor = "gone";
      return;
    }
    if (manifestFor === selected) return;
    const m = await api(`/datasets/${encodeURIComponent(name)}/versions/${encodeURIComponent(selected)}/manifest`);
    manifestFor = selected;
    files.replaceChildren(...manifestTable(m));
  }

  const root = h("section", { class: "page dataset" },
    h("div", { class: "toolbar" }, h("a", { href: "#/datasets" }, "Datasets"), title, owner, message),
    h("section", { class: "card" }, h("h2", {}, "Versions, newest first"), usedBy,
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "versions-table" },
        head(["Version", "Files", "Size", "Digest", "Source", "Checksums", "Description", "Added by", "Added",
          "Jobs", ""]), rows))),
    h("section", { class: "card", testid: "manifest-section" }, filesTitle, files));

  view.poll(async () => {
    let data;
    try {
      [data, me] = await Promise.all([api(`/datasets/${encodeURIComponent(name)}`),
        me ? Promise.resolve(me) : api("/whoami")]);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        root.replaceChildren(h("h1", {}, name), h("p", { class: "error", testid: "not-found" }, err.message),
          h("p", {}, h("a", { href: "#/datasets" }, "Back to the datasets")));
        return false;
      }
      throw err;
    }
    // each version's jobs come with it
    const newest = [...data.versions].reverse();
    const jobs = newest.map((v) => v.jobs);
    if (!view.alive) return false;
    document.title = `${name} · datasets · trainhouse`;
    const d = data.dataset;
    owner.textContent = `owner ${d.owner} · ${d.versions} version${d.versions === 1 ? "" : "s"}`;
    usedBy.replaceChildren("Jobs that pinned a version: ", h("span", {}, jobLinks(data.jobs, "dataset-job")));
    // redrawn when something changed, or (for the "ago" times) every half minute while no
    // confirmation is open: an open one stays
    const key = JSON.stringify([d, newest, jobs, me]);
    const asking = rows.querySelector("[data-testid=version-remove-dialog]:not([hidden])");
    if (key !== lastRows || (!asking && Date.now() - drawnAt > 30000)) {
      lastRows = key;
      drawnAt = Date.now();
      rows.replaceChildren(...(newest.length ? newest.map((v, i) => versionRow(d, v, jobs[i]))
        : [h("tr", { class: "empty" }, h("td", { colspan: "11" }, "No versions left."))]));
    }
    await showManifest(data.versions);
    return true;
  }, POLL_MS);
  return root;
}

/** A job's pinned dataset versions (its page's summary): key, NAME@N linking to the version,
 * the digest shortened. */
export function jobDatasets(job) {
  const pins = job.datasets || [];
  if (!pins.length) return null;
  return h("span", { testid: "job-datasets" }, pins.flatMap((p, i) => [i ? ", " : null,
    h("span", { testid: "job-dataset", "data-key": p.key },
      h("span", { testid: "job-dataset-key" }, p.key), ": ",
      h("a", { href: datasetHref(p.name, p.version), testid: "job-dataset-ref" }, p.ref),
      " ", h("span", { class: "mono muted", title: p.digest }, short(p.digest)))]));
}
