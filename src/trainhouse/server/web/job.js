// A job's page (#/jobs/<id>): state, cancel, datasets, its flow (what it waits for, reads and
// promotes), metrics, media (media.js), system, logs, attempts, checkpoints, artifacts
// (artifacts.js); an elastic or resized job's world size over time (sizes.js).
import { experimentCard } from "./runs.js";
import { ChartGrid, MetricSeries, chartControls, drawSystem, systemSeries } from "./charts.js";
import {
  API,
  ApiError,
  LOG_POLL_MS,
  LOG_TAIL_LINES,
  POLL_MS,
  TERMINAL,
  api,
  badge,
  exitText,
  fmtBytes,
  fmtDuration,
  fmtTime,
  h,
  kv,
  metricsText,
  placementText,
  progressCell,
  progressOf,
  timeCell,
  toYaml,
  worldSize,
} from "./core.js";
import { artifactsCard } from "./artifacts.js";
import { jobDatasets } from "./datasets.js";
import { jobFlowFacts } from "./flows.js";
import { AnsiRenderer, LogView } from "./logs.js";
import { jobMedia } from "./media.js";
import { attemptRanks, resourcesText, sizeCard } from "./sizes.js";

/** How an attempt's processes ended, as people read it: a stopped attempt (canceled,
 * preempted, pruned) says so, and that its ranks exited cleanly when they all exited 0, rather
 * than the signal its launcher got. */
function attemptExit(a) {
  const stopped = { canceled: "canceled", preempted: "preempted", pruned: "pruned", resized: "resized",
    interrupted: "server stopped" }[a.result];
  if (!stopped) return exitText(a.exit_code);
  const codes = Object.values(a.rank_exit_codes || {});
  const clean = codes.length && codes.every((c) => c === 0);
  return clean ? `${stopped}; ranks exited cleanly` : stopped;
}

/** How an ended job's processes ended: its last attempt's words when it was stopped (a
 * canceled job's launcher got SIGTERM; its ranks may all have exited 0), else its exit code. */
function jobExit(job) {
  const last = (job.attempt_history || []).at(-1);
  const stopped = last && TERMINAL.has(job.state) && (last.result === "canceled" || last.result === "pruned");
  return stopped ? attemptExit(last) : exitText(job.exit_code);
}

export function attemptsTable(job) {
  const rows = (job.attempt_history || []).map((a) => h("tr", { testid: "attempt-row" },
    h("td", { class: "num" }, String(a.number)),
    h("td", {}, timeCell(a.started_at)),
    h("td", {}, a.ended_at ? fmtDuration(a.ended_at - a.started_at) : h("span", { class: "muted" }, "running")),
    h("td", { class: "num", testid: "attempt-ranks" }, String(attemptRanks(a) ?? "—")),
    h("td", { testid: "attempt-result" }, a.result ? h("span", { class: `result result-${a.result}` }, a.result) : "—"),
    h("td", {}, a.failure || "—"),
    h("td", { class: "num", testid: "attempt-exit" }, attemptExit(a)),
    h("td", { class: "mono" }, a.rank_exit_codes ? Object.entries(a.rank_exit_codes).map(([r, c]) => `${r}:${exitText(c)}`).join(" ") : "—"),
    h("td", { class: "num" }, a.failed_rank ?? "—"),
    h("td", { class: "reason" }, a.reason || "—"),
    h("td", {}, placementText(a.placement)),
    h("td", {}, a.log_tail ? h("details", {}, h("summary", {}, "log tail"), h("pre", { class: "log small" }, new AnsiRenderer().render(a.log_tail))) : "—")));
  if (!rows.length) return h("p", { class: "muted" }, "No attempt yet: the job has not started.");
  return h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "attempts-table" },
    h("thead", {}, h("tr", {}, ["#", "Started", "Ran", "Ranks", "Result", "Failure", "Exit", "Rank exits", "Failed rank", "Reason", "Placement", "Log"].map((c) => h("th", {}, c)))),
    h("tbody", {}, rows)));
}

export function eventsTable(job) {
  const rows = (job.events || []).map((e) => h("tr", {},
    h("td", {}, timeCell(e.at)),
    h("td", {}, e.from_state ? badge(e.from_state) : "—", " → ", badge(e.to_state)),
    h("td", { class: "reason" }, e.reason || "")));
  return h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "events-table" },
    h("thead", {}, h("tr", {}, h("th", {}, "When"), h("th", {}, "Change"), h("th", {}, "Why"))),
    h("tbody", {}, rows)));
}

export function checkpointsTable(jobId, data) {
  const list = data.checkpoints || [];
  if (!list.length) return h("p", { class: "muted" }, "No checkpoint saved yet.");
  const rows = list.map((c) => {
    const base = `${API}/jobs/${jobId}/checkpoints/${c.id}`;
    const link = c.kind === "sharded"
      ? h("a", { href: `${base}/files`, target: "_blank", rel: "noopener" }, "files")
      : h("a", { href: `${base}/content`, download: c.path.split("/").pop() || `checkpoint-${c.step}`, testid: "checkpoint-download" }, "download");
    return h("tr", { testid: "checkpoint-row", "data-step": c.step },
      h("td", { class: "num" }, String(c.step)),
      h("td", { class: "num" }, String(c.attempt)),
      h("td", {}, c.kind),
      h("td", { class: "num" }, fmtBytes(c.size)),
      h("td", { class: "mono", title: `${c.algorithm || "sha256"}:${c.sha256}`, testid: "checkpoint-digest" }, `${c.algorithm || "sha256"}:${c.sha256.slice(0, 12)}`),
      h("td", {}, metricsText(c.metrics, 4)),
      h("td", {}, timeCell(c.created_at)),
      h("td", { class: "mono path", title: c.path }, c.path),
      h("td", {}, link));
  });
  return h("div", { class: "table-wrap" },
    h("table", { class: "grid", testid: "checkpoints-table" },
      h("thead", {}, h("tr", {}, ["Step", "Attempt", "Kind", "Size", "Digest", "Metrics", "Saved", "Path", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows)),
    data.directory ? h("p", { class: "muted small" }, `Stored in ${data.directory}`) : null);
}

export function jobPage(view, jobId) {
  let job = null;
  const title = h("h1", {}, `Job ${jobId}`);
  const state = badge("…", "job-state");
  const subState = h("span", { class: "muted", testid: "job-substate" }, "");
  const cancelMsg = h("span", { class: "muted", testid: "cancel-message" }, "");
  const cancelBtn = h("button", { class: "danger", testid: "cancel-button", hidden: true,
    onclick: () => { confirm.hidden = false; cancelBtn.hidden = true; } }, "Cancel job");
  const confirm = h("span", { class: "confirm", testid: "cancel-dialog", hidden: true },
    `Cancel job ${jobId}? Its ranks are asked to stop, then killed. `,
    h("button", { class: "danger", testid: "cancel-confirm", onclick: () => doCancel() }, "Yes, cancel it"),
    h("button", { testid: "cancel-abort", onclick: () => { confirm.hidden = true; cancelBtn.hidden = false; } }, "Keep running"));
  let canceling = false;

  async function doCancel() {
    confirm.hidden = true;
    canceling = true;
    cancelMsg.textContent = "canceling…";
    try {
      const out = await api(`/jobs/${jobId}/cancel`, { method: "POST" });
      cancelMsg.textContent = TERMINAL.has(out.state) ? "" : "cancel requested; waiting for the ranks to stop";
    } catch (err) {
      canceling = false;
      cancelMsg.textContent = `cancel failed: ${err.message}`;
    }
    view.wake();
  }

  // resume (a canceled or failed job, the same job) and clone (a new job, same code)
  const lineageMsg = h("span", { class: "muted", testid: "lineage-message" }, "");
  const resumeBtn = h("button", { testid: "resume-button", hidden: true,
    title: "Queue this job again: it continues from its latest checkpoint",
    onclick: () => doResume() }, "Resume");
  const cloneSets = h("input", { type: "text", testid: "clone-set", size: "36",
    placeholder: "hparams.lr=0.01 name=again", "aria-label": "overrides (key=value, space separated)" });
  const cloneFrom = h("select", { testid: "clone-from", "aria-label": "start from" },
    h("option", { value: "" }, "from the start"),
    h("option", { value: "latest" }, "from its latest checkpoint"));
  const cloneDialog = h("span", { class: "confirm", testid: "clone-dialog", hidden: true },
    "Clone with ", cloneSets, " ", cloneFrom, " ",
    h("button", { testid: "clone-confirm", onclick: () => doClone() }, "Clone"),
    h("button", { testid: "clone-abort", onclick: () => { cloneDialog.hidden = true; cloneBtn.hidden = false; } }, "Back"));
  const cloneBtn = h("button", { testid: "clone-button",
    title: "A new job with this job's code and spec, with overrides",
    onclick: () => { cloneDialog.hidden = false; cloneBtn.hidden = true; cloneSets.focus(); } }, "Clone…");

  async function doResume() {
    resumeBtn.disabled = true;
    lineageMsg.textContent = "resuming…";
    try {
      const out = await api(`/jobs/${jobId}/resume`, { method: "POST" });
      lineageMsg.textContent = out.reason || "queued again";
      source.reopen(); // the job runs again: the pollers that stopped at its end go on
      for (const p of panes.values()) p.ended = false;
      view.wake();
    } catch (err) {
      lineageMsg.textContent = `resume refused: ${err.message}`;
    }
    resumeBtn.disabled = false;
  }

  async function doClone() {
    const body = { set: cloneSets.value.trim() ? cloneSets.value.trim().split(/\s+/) : [] };
    if (cloneFrom.value) body.from_checkpoint = cloneFrom.value;
    lineageMsg.textContent = "cloning…";
    try {
      const out = await api(`/jobs/${jobId}/clone`, {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
      location.hash = `#/jobs/${out.id}`;
    } catch (err) {
      lineageMsg.textContent = `clone refused: ${err.message}`;
    }
  }

  const lineage = () => {
    const out = [];
    if (job.cloned_from !== null && job.cloned_from !== undefined) {
      out.push(...kv("Cloned from", h("span", {},
        h("a", { href: `#/jobs/${job.cloned_from}`, testid: "cloned-from-link" }, `#${job.cloned_from}`),
        job.cloned_step !== null && job.cloned_step !== undefined ? ` (its checkpoint of step ${job.cloned_step})` : " (from the start)")));
    }
    if (job.clones && job.clones.length) {
      out.push(...kv("Clones", h("span", { testid: "clone-links" }, job.clones.map((c, i) => [
        i ? ", " : "", h("a", { href: `#/jobs/${c.id}`, testid: "clone-link" }, `#${c.id}`), ` ${c.state.toLowerCase()}`]))));
    }
    return out;
  };

  const summary = h("dl", { class: "summary", testid: "job-summary" });
  const experiment = experimentCard(jobId, () => view.wake());
  const reason = h("p", { class: "reason-line", testid: "job-reason" });

  // metrics
  const chartOpts = { smoothing: 0, log: false };
  const metricsGrid = h("div", { class: "charts", testid: "metric-charts" });
  const charts = new ChartGrid(metricsGrid, "chart-", chartOpts);
  const metricsNote = h("p", { class: "muted", testid: "metrics-note" }, "Loading metrics…");
  const source = new MetricSeries(jobId);
  const drawMetrics = () => {
    for (const [name, s] of source.series) charts.set(name, name, [{ name, x: s.x, y: s.y }]);
    charts.keep(new Set(source.series.keys()));
    metricsNote.textContent = source.series.size ? "" : "No metrics reported yet.";
  };
  const controls = chartControls(chartOpts, () => { charts.redraw(); sysCharts.redraw(); });

  // system (monitoring): nothing at all unless the route exists and has series
  const sysGrid = h("div", { class: "charts" });
  const sysCharts = new ChartGrid(sysGrid, "system-chart-", chartOpts);
  // world size (elastic or resized jobs only)
  const sizes = sizeCard();

  const sysSection = h("section", { class: "card", testid: "system-section", hidden: true },
    h("h2", {}, "System"), sysGrid);

  // logs
  const world = () => (job ? worldSize(job.spec) : 1);
  const logTabs = h("div", { class: "tabs", role: "tablist", testid: "log-tabs" });
  const logBody = h("div", { class: "log-body" });
  const rawLink = h("a", { class: "muted small", target: "_blank", rel: "noopener" }, "raw");
  const wrap = h("input", { type: "checkbox", checked: true,
    onchange: () => logBody.classList.toggle("nowrap", !wrap.checked) });
  // the time each line was written, and a filter (a regular expression, applied by the server)
  const stampBox = h("input", { type: "checkbox", testid: "log-timestamps", onchange: () => resetLogs() });
  const filterBox = h("input", { type: "search", testid: "log-filter", placeholder: "filter (regex)",
    "aria-label": "show only the lines this regular expression matches", size: "18",
    oninput: () => { clearTimeout(filterTimer); filterTimer = setTimeout(() => resetLogs(), 300); } });
  let filterTimer = null;
  const panes = new Map();
  let activeRank = "0";
  let rankChosen = false; // the user picked a tab: the page no longer picks the failed rank's
  const pane = (rank) => {
    if (!panes.has(rank)) {
      const el = h("pre", { class: "log", testid: `log-rank-${rank}`, "data-rank": rank, tabindex: "0" });
      panes.set(rank, { el, log: new LogView(el), offset: null, ended: false });
      logBody.append(el);
    }
    return panes.get(rank);
  };
  const resetLogs = () => {
    for (const p of panes.values()) p.el.remove();
    panes.clear();
    showRank(activeRank);
  };
  const showRank = (rank, chosen = false) => {
    rankChosen = rankChosen || chosen;
    activeRank = rank;
    for (const [r, p] of panes) p.el.hidden = r !== rank;
    pane(rank).el.hidden = false;
    rawLink.href = `${API}/jobs/${jobId}/logs?rank=${rank}`;
    for (const b of logTabs.children) b.setAttribute("aria-selected", String(b.dataset.rank === rank));
    logPoller.now();
  };
  let tabsFor = null;
  const renderTabs = () => {
    const n = Math.min(world(), 64);
    if (tabsFor === n) return;
    tabsFor = n;
    const ranks = [...Array(n).keys()].map(String);
    const tabs = [...(n > 1 ? ["all"] : []), ...ranks, "launcher"];
    const label = (r) => (r === "launcher" ? "launcher" : r === "all" ? "all ranks" : `rank ${r}`);
    logTabs.replaceChildren(...tabs.map((r) => h("button", {
      role: "tab", "data-rank": r, testid: `log-tab-${r}`, "aria-selected": String(r === activeRank),
      title: r === "all" ? "every rank's lines in the order they were written" : null,
      onclick: () => showRank(r, true),
    }, label(r))));
  };
  /** The rank that failed first in the latest attempt, when one did. */
  const failedRank = () => {
    const attempts = (job && job.attempt_history) || [];
    const last = attempts[attempts.length - 1];
    return last && last.failed_rank !== null && last.failed_rank !== undefined ? String(last.failed_rank) : null;
  };

  // checkpoints, attempts, events, spec
  const ckptBox = h("div", { testid: "checkpoints" }, h("p", { class: "muted" }, "Loading…"));
  const attemptsBox = h("div", { testid: "attempts" });
  const eventsBox = h("div", { testid: "events" });
  const specPre = h("pre", { class: "spec", testid: "job-spec" });
  let specFormat = "yaml";
  const specToggle = h("button", { class: "small", onclick: () => {
    specFormat = specFormat === "yaml" ? "json" : "yaml";
    specToggle.textContent = specFormat === "yaml" ? "as JSON" : "as YAML";
    renderSpec();
  } }, "as JSON");
  const renderSpec = () => {
    if (!job) return;
    specPre.textContent = specFormat === "yaml" ? toYaml(job.spec) : JSON.stringify(job.spec, null, 2);
  };
  let lastAttempts = "";
  let lastEvents = "";

  const renderJob = () => {
    document.title = `${job.name} (#${job.id}) · trainhouse`;
    title.replaceChildren(`#${job.id} `, h("span", { testid: "job-name" }, job.name), " ");
    state.textContent = job.state;
    state.className = `badge state-${job.state.toLowerCase()}`;
    const flags = [];
    if (job.cancel_requested && !TERMINAL.has(job.state)) flags.push("cancel requested");
    if (job.preempt_requested && !TERMINAL.has(job.state)) flags.push("preemption requested");
    subState.textContent = flags.join(", ");
    const ended = TERMINAL.has(job.state);
    cancelBtn.hidden = ended || !confirm.hidden;
    cancelBtn.disabled = canceling || job.cancel_requested;
    cancelBtn.textContent = canceling || job.cancel_requested ? "Canceling…" : "Cancel job";
    if (ended) {
      confirm.hidden = true;
      cancelMsg.textContent = "";
    }
    resumeBtn.hidden = !(job.state === "FAILED" || job.state === "CANCELED") || !job.checkpoints;
    experiment.update(job);
    const p = progressOf(job);
    const running = job.started_at ? (job.ended_at || Date.now() / 1000) - job.started_at : null;
    summary.replaceChildren(
      ...kv("Owner", job.owner),
      ...kv("Priority", job.priority),
      ...(job.search_id ? kv("Search", h("a", { href: `#/searches/${job.search_id}`, testid: "job-search-link" },
        `a trial of search ${job.search_id}` + (job.prune_requested ? " (pruned)" : ""))) : []),
      ...jobFlowFacts(job),
      ...kv("Progress", progressCell(job), "job-progress"),
      ...(job.environment ? kv("Environment", job.environment, "job-environment") : []),
      ...(job.datasets && job.datasets.length ? kv("Datasets", jobDatasets(job)) : []),
      ...(job.staging ? kv("Staging", job.staging, "job-staging") : []),
      ...kv("Attempts", `${job.attempts}` + (job.restarts || job.infra_restarts ? ` (${job.restarts} restarts after failures, ${job.infra_restarts || 0} after infrastructure faults)` : "") +
        (job.resumes ? `; resumed ${job.resumes}×` : ""), "job-attempts"),
      ...lineage(),
      ...kv("Submitted", fmtTime(job.created_at)),
      ...kv("Started", fmtTime(job.started_at)),
      ...kv(ended ? "Ended" : "Running for", ended ? fmtTime(job.ended_at) : running === null ? "—" : fmtDuration(running)),
      ...kv("Exit code", jobExit(job), "job-exit"),
      ...kv("Resources", resourcesText(job), "job-resources"),
      ...kv("Placement", placementText(job.placement)),
      ...kv("Latest metrics", metricsText(job.latest_metrics, 8)),
      ...kv("Job directory", h("span", { class: "mono small" }, job.job_dir || "—")));
    summary.dataset.progress = p.text;
    reason.textContent = job.reason ? `${job.state === "QUEUED" ? "Waiting: " : ""}${job.reason}` : "";
    sizes.update(job); // each poll: the running attempt's line reaches now
    const attemptsKey = JSON.stringify(job.attempt_history);
    if (attemptsKey !== lastAttempts) {
      lastAttempts = attemptsKey;
      attemptsBox.replaceChildren(attemptsTable(job));
    }
    const eventsKey = JSON.stringify(job.events);
    if (eventsKey !== lastEvents) {
      lastEvents = eventsKey;
      eventsBox.replaceChildren(eventsTable(job));
    }
    if (!specPre.textContent) renderSpec();
    renderTabs();
    const failed = failedRank();
    if (!rankChosen && failed !== null && failed !== activeRank) showRank(failed);
  };

  view.poll(async () => {
    try {
      job = await api(`/jobs/${jobId}`);
    } catch (err) {
      if (err instanceof ApiError && (err.status === 404 || err.status === 403)) {
        root.replaceChildren(h("h1", {}, `Job ${jobId}`), h("p", { class: "error", testid: "not-found" }, err.message));
        view.stop();
        return false;
      }
      throw err;
    }
    renderJob();
    // a completed job's promotion is decided just after its end: watch until it is
    const deciding = job.state === "COMPLETED" && job.promotion && job.promotion.promoted === null;
    return !TERMINAL.has(job.state) || Boolean(deciding);
  }, POLL_MS);

  view.poll(async () => {
    if (await source.update(job)) drawMetrics();
    else if (!source.series.size) metricsNote.textContent = "No metrics reported yet.";
    return !source.complete;
  }, POLL_MS);

  let systemMissing = false;
  view.poll(async () => {
    if (systemMissing) return false;
    let data;
    try {
      data = await api(`/jobs/${jobId}/system`);
    } catch (err) {
      if (err instanceof ApiError && (err.status === 404 || err.status === 405)) {
        // no such route on this server, or nothing sampled for this job: draw nothing
        if (err.code !== "not_found" || /not found/i.test(err.message)) systemMissing = true;
        return !systemMissing;
      }
      throw err;
    }
    const series = systemSeries(data);
    sysSection.hidden = series.length === 0; // shown before drawing, so charts get their width
    drawSystem(sysCharts, series);
    return !(job && TERMINAL.has(job.state));
  }, POLL_MS * 2);

  const logPoller = view.poll(async () => {
    const rank = activeRank;
    const p = pane(rank);
    if (p.ended) return true;
    const all = rank === "all"; // re-read whole each time: every rank's last lines, by time
    let params = p.offset === null || all ? `tail=${LOG_TAIL_LINES}` : `offset=${p.offset}`;
    if (stampBox.checked) params += "&timestamps=true";
    if (filterBox.value) params += `&grep=${encodeURIComponent(filterBox.value)}`;
    let resp;
    try {
      resp = await api(`/jobs/${jobId}/logs?rank=${encodeURIComponent(rank)}&${params}`, { raw: true });
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 422) throw err;
      p.el.replaceChildren();
      p.log = new LogView(p.el);
      p.log.note(err.message); // a filter that is not a regular expression
      p.ended = true;
      return true;
    }
    const text = await resp.text();
    if (all) {
      const jobEnded = TERMINAL.has(resp.headers.get("X-Job-State") || "");
      if (text !== p.last) {
        p.last = text;
        p.el.replaceChildren();
        p.log = new LogView(p.el);
        p.log.append(text);
      }
      p.ended = jobEnded;
      return true;
    }
    const next = Number(resp.headers.get("X-Log-Offset"));
    const jobState = resp.headers.get("X-Job-State");
    if (p.offset === null && next > new TextEncoder().encode(text).length) {
      p.log.note(`… earlier output not shown (the last ${LOG_TAIL_LINES} lines follow; "raw" has it all)`);
    }
    p.offset = Number.isFinite(next) ? next : p.offset;
    if (text) p.log.append(text);
    if (!text && jobState && TERMINAL.has(jobState)) {
      p.ended = true;
      if (p.log.partial) p.log.append("\n");
      if (!p.el.textContent) p.log.note("(no output)");
    }
    return true;
  }, LOG_POLL_MS);
  showRank("0");

  view.poll(async () => {
    const data = await api(`/jobs/${jobId}/checkpoints`);
    ckptBox.replaceChildren(checkpointsTable(jobId, data));
    return !(job && TERMINAL.has(job.state));
  }, POLL_MS * 2.5);

  const artifacts = artifactsCard(view, jobId, () => job);
  const mediaSection = jobMedia(view, jobId, () => !!(job && TERMINAL.has(job.state)));

  const root = h("section", { class: "page job" },
    h("div", { class: "job-head" },
      h("div", { class: "title-line" }, title, state, subState),
      h("div", { class: "actions" },
        h("a", { class: "button", href: `#/compare?ids=${jobId}`, testid: "compare-link" }, "Compare…"),
        resumeBtn, cloneBtn, cloneDialog, cancelBtn, confirm, cancelMsg, lineageMsg)),
    reason,
    h("section", { class: "card" }, summary),
    experiment.el,
    h("section", { class: "card", testid: "metrics-section" },
      h("div", { class: "card-head" }, h("h2", {}, "Metrics"), controls), metricsNote, metricsGrid),
    mediaSection,
    sizes.el,
    sysSection,
    h("section", { class: "card", testid: "logs-section" },
      h("div", { class: "card-head" }, h("h2", {}, "Logs"), logTabs, h("span", { class: "spacer" }),
        filterBox, h("label", { class: "small", title: "when each line was written (UTC)" }, stampBox, " timestamps"),
        h("label", { class: "small" }, wrap, " wrap"), rawLink),
      logBody),
    h("section", { class: "card" }, h("h2", {}, "Attempts"), attemptsBox),
    h("section", { class: "card" }, h("h2", {}, "Checkpoints"), ckptBox),
    artifacts.el,
    h("section", { class: "card" }, h("h2", {}, "Events"), eventsBox),
    h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", {}, "Spec"), specToggle), specPre));
  return root;
}
