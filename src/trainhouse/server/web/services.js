// Services (trainhouse serve NAME@ALIAS): #/services (every service: its state, the version that
// answers, ready replicas, requests/s, batch size and latency percentiles, live) and
// #/services/<name> (what it follows, the problem if any, each replica, the traffic over the
// time the page is open, Stop). Everything a service shows (names, owners, a replica's error)
// goes into the page as text.
import { drawChart } from "./charts.js";
import { ApiError, POLL_MS, api, fmtNum, h, kv, timeCell } from "./core.js";

const CHART_POINTS = 1800; // an hour of 2-second polls; older points leave the chart
const OVER = new Set(["stopped", "failed", "lost"]); // nothing left to stop

const head = (cols) => h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c))));
const serviceHref = (name) => `#/services/${encodeURIComponent(name)}`;
const modelHref = (model, version) =>
  `#/models/${encodeURIComponent(model)}${version === null || version === undefined ? "" : `?version=${version}`}`;

/** The version that answers: "2", "switching 1→2" while ready replicas serve different ones,
 * "1 (ref names 2)" while they all serve another than the one the ref names now. */
export function versionText(s) {
  const versions = s.versions || [];
  if (!versions.length) return "—";
  if (versions.length > 1) {
    const to = versions.includes(s.target_version) ? s.target_version : versions[versions.length - 1];
    return `switching ${versions.filter((v) => v !== to).join(",")}→${to}`;
  }
  const [v] = versions;
  if (s.target_version !== null && s.target_version !== v) return `${v} (ref names ${s.target_version})`;
  return String(v);
}

export function serviceBadge(state, testid) {
  return h("span", { class: `badge state-${String(state).toLowerCase()}`, testid, "data-state": state }, state);
}

/** Milliseconds as a table shows them: 3 significant digits, "—" for none yet. */
export function fmtMs(v) {
  if (v === null || v === undefined) return "—";
  return v >= 100 ? v.toFixed(0) : String(Number(v.toPrecision(3)));
}

const rate = (v) => (v === null || v === undefined ? "—" : fmtNum(Number(v.toFixed(2))));

function jobLink(s) {
  if (s.job_id === null) return "—";
  return h("a", { href: `#/jobs/${s.job_id}`, testid: "service-job" },
    `#${s.job_id}`, s.job_state ? h("span", { class: "muted" }, ` ${s.job_state}`) : null);
}

export function servicesPage(view) {
  const rows = h("tbody", { testid: "service-rows" });
  view.poll(async () => {
    const { services } = await api("/services");
    if (!view.alive) return false;
    rows.replaceChildren(...(services.length ? services.map((s) => {
      const lat = s.stats.latency_ms;
      return h("tr", { testid: "service-row", "data-service": s.name, "data-state": s.state },
        h("td", {}, h("a", { href: serviceHref(s.name), testid: "service-link" }, s.name)),
        h("td", {}, h("a", { href: modelHref(s.model) }, `${s.model}@${s.ref}`)),
        h("td", { class: "num", testid: "service-version" }, versionText(s)),
        h("td", {}, serviceBadge(s.state, "service-state")),
        h("td", { class: "num", testid: "service-replicas" }, `${s.ready_replicas}/${s.replicas}`),
        h("td", { class: "num", testid: "service-rps" }, rate(s.stats.requests_per_s)),
        h("td", { class: "num", testid: "service-batch" }, rate(s.stats.mean_batch)),
        h("td", { class: "num", testid: "service-p50" }, fmtMs(lat.p50)),
        h("td", { class: "num", testid: "service-p95" }, fmtMs(lat.p95)),
        h("td", { class: "num", testid: "service-p99" }, fmtMs(lat.p99)),
        h("td", { class: "num", testid: "service-requests" }, String(s.stats.requests_total)),
        h("td", {}, jobLink(s)));
    }) : [h("tr", { class: "empty" }, h("td", { colspan: "12" },
      "No services yet: trainhouse serve NAME@ALIAS starts one."))]));
  }, POLL_MS);
  return h("section", { class: "page services" },
    h("div", { class: "toolbar" }, h("h1", {}, "Services"),
      h("span", { class: "muted small" }, "traffic over the last minute; requests/s over the last 10 s")),
    h("section", { class: "card" }, h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "services-table" },
      head(["Name", "Serves", "Version", "State", "Ready", "Requests/s", "Mean batch", "p50 ms", "p95 ms",
        "p99 ms", "Requests", "Job"]), rows))));
}

/** Who may stop it, as the server decides: an admin (or anyone, auth off), or its owner. */
function mayStop(me, service) {
  if (!me) return false;
  return me.role === "open" || me.role === "admin" || (me.role === "member" && me.name === service.owner);
}

function replicaRows(s) {
  if (!s.replica_list.length) {
    return [h("tr", { class: "empty" }, h("td", { colspan: "9" },
      OVER.has(s.state) ? "No replica: the service is not running." : "No replica has called in yet."))];
  }
  return s.replica_list.map((r) => h("tr", { testid: "replica-row", "data-rank": r.rank, "data-state": r.state },
    h("td", { class: "num" }, String(r.rank)),
    h("td", {}, serviceBadge(r.state, "replica-state")),
    h("td", { class: "num", testid: "replica-version" }, r.version === null ? "—" : String(r.version)),
    h("td", { class: "num", testid: "replica-requests" }, String(r.requests)),
    h("td", { class: "num" }, String(r.batches)),
    h("td", { class: "num" }, String(r.examples)),
    h("td", {}, timeCell(r.last_seen)),
    h("td", {}, timeCell(r.started_at)),
    h("td", { class: "reason", testid: "replica-error" }, r.error || "—")));
}

export function servicePage(view, name) {
  const title = h("h1", {}, name);
  const state = serviceBadge("…", "service-state");
  const problemLine = h("p", { class: "error", testid: "service-problem", hidden: true });
  const summary = h("dl", { class: "summary", testid: "service-summary" });
  const traffic = h("dl", { class: "summary", testid: "service-traffic" });
  const replicas = h("tbody", { testid: "replica-rows" });
  const rpsChart = h("div", { class: "chart", testid: "service-chart-rps" });
  const p99Chart = h("div", { class: "chart", testid: "service-chart-p99" });
  const series = { at: [], rps: [], p99: [] };

  // Stop: members (their own) and admins; viewers never see it; asked twice
  const message = h("span", { class: "muted", testid: "service-stop-message" }, "");
  const stopBtn = h("button", { class: "danger", testid: "service-stop", hidden: true,
    onclick: () => { dialog.hidden = false; stopBtn.hidden = true; } }, "Stop");
  const dialog = h("span", { class: "confirm", testid: "service-stop-dialog", hidden: true },
    `Stop ${name}? Its replicas end; predictions get 503.`,
    h("button", { class: "danger", testid: "service-stop-confirm", onclick: () => doStop() }, "Yes, stop it"),
    h("button", { testid: "service-stop-abort", onclick: () => { dialog.hidden = true; render(); } }, "Keep serving"));
  let me = null;
  let last = null;
  let stopping = false;

  async function doStop() {
    dialog.hidden = true;
    stopping = true;
    message.textContent = "stopping…";
    try {
      last = await api(`/services/${encodeURIComponent(name)}/stop`, { method: "POST" });
      message.textContent = "";
    } catch (err) {
      message.textContent = `stop refused: ${err.message}`;
    }
    stopping = false;
    render();
    view.wake();
  }

  function render() {
    const s = last;
    if (!s) return;
    document.title = `${s.name} · services · trainhouse`;
    state.textContent = s.state;
    state.className = `badge state-${s.state}`;
    state.dataset.state = s.state;
    stopBtn.hidden = !mayStop(me, s) || OVER.has(s.state) || s.state === "stopping" || !dialog.hidden;
    stopBtn.disabled = stopping;
    if (OVER.has(s.state) || s.state === "stopping") dialog.hidden = true;
    problemLine.hidden = !s.problem;
    problemLine.textContent = s.problem ? `Its ref names no version: ${s.problem}` : "";
    const target = s.target_version === null ? "no version now"
      : h("a", { href: modelHref(s.model, s.target_version), testid: "service-target" }, `version ${s.target_version}`);
    summary.replaceChildren(
      ...kv("Follows", h("span", {}, h("a", { href: modelHref(s.model), testid: "service-model" }, `${s.model}@${s.ref}`),
        " (names ", target, ")")),
      ...kv("Answering", versionText(s), "service-version"),
      ...kv("Replicas", `${s.ready_replicas} of ${s.replicas} ready` +
        (s.gpus_per_replica ? `, ${s.gpus_per_replica} GPU each` : ", CPU"), "service-replicas"),
      ...kv("Job", jobLink(s)),
      ...kv("Batching", `up to ${s.max_batch} examples, waiting up to ${fmtNum(s.max_wait_ms)} ms for more`),
      ...kv("Owner", s.owner, "service-owner"),
      ...kv("Priority", s.priority),
      ...kv("Started or stopped", timeCell(s.updated_at)));
    const st = s.stats;
    traffic.replaceChildren(
      ...kv("Requests/s", rate(st.requests_per_s), "service-rps"),
      ...kv("Errors/s", rate(st.errors_per_s), "service-eps"),
      ...kv("Requests (errors) since the server started", `${st.requests_total} (${st.errors_total})`, "service-requests"),
      ...kv("Mean batch", rate(st.mean_batch), "service-batch"),
      ...kv(`Latency p50 / p95 / p99 (last ${fmtNum(st.window_s)} s)`,
        `${fmtMs(st.latency_ms.p50)} / ${fmtMs(st.latency_ms.p95)} / ${fmtMs(st.latency_ms.p99)} ms`, "service-latency"));
    replicas.replaceChildren(...replicaRows(s));
  }

  function chart() {
    series.at.push(Date.now());
    series.rps.push(last.stats.requests_per_s);
    series.p99.push(last.stats.latency_ms.p99);
    if (series.at.length > CHART_POINTS) for (const k of Object.keys(series)) series[k].shift();
    const opts = { xType: "date", xTitle: "" };
    drawChart(rpsChart, "requests/s (last 10 s)", [{ name: "requests/s", x: series.at, y: series.rps }], opts);
    drawChart(p99Chart, "p99 latency, ms (last minute)",
      [{ name: "p99 ms", x: series.at, y: series.p99, color: "#e4572e" }], opts);
  }

  const root = h("section", { class: "page service" },
    h("div", { class: "job-head" },
      h("div", { class: "title-line" }, h("a", { href: "#/services" }, "Services"), title, state),
      h("div", { class: "actions" }, stopBtn, dialog, message)),
    problemLine,
    h("section", { class: "card" }, summary),
    h("section", { class: "card", testid: "traffic-section" }, h("h2", {}, "Traffic"), traffic,
      h("div", { class: "charts" }, rpsChart, p99Chart)),
    h("section", { class: "card" }, h("h2", {}, "Replicas"),
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "replicas-table" },
        head(["Rank", "State", "Version", "Requests", "Batches", "Examples", "Last seen", "Up since", "Error"]), replicas))));

  view.poll(async () => {
    try {
      const [found, who] = await Promise.all([
        api(`/services/${encodeURIComponent(name)}`), me ? Promise.resolve(me) : api("/whoami")]);
      last = found;
      me = who;
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        root.replaceChildren(h("h1", {}, name), h("p", { class: "error", testid: "not-found" }, err.message),
          h("p", {}, h("a", { href: "#/services" }, "Back to the services")));
        return false;
      }
      throw err;
    }
    if (!view.alive) return false;
    render();
    chart();
    return true; // a stopped service may be started again under its name: keep watching
  }, POLL_MS);
  return root;
}
