// The queue (#/queue) and the nodes (#/nodes).
import { ChartGrid, drawSystem, systemSeries } from "./charts.js";
import {
  ApiError,
  POLL_MS,
  api,
  fmtBytes,
  fmtDuration,
  fmtNum,
  h,
  kv,
  placementText,
  progressCell,
  timeCell,
} from "./core.js";

const TIERS = ["low", "normal", "high", "urgent"]; // the server says who may use which

export function queuePage(view) {
  const rows = h("tbody", { testid: "queue-rows" });
  const running = h("tbody", { testid: "running-rows" });
  const preempting = h("div", { testid: "preempting" });
  const count = h("span", { class: "muted", testid: "queue-count" });
  const message = h("span", { class: "muted", testid: "queue-message" }, "");
  let lastRows = "";

  // the same routes (and rules) as `trainhouse set-priority` and `trainhouse cancel`
  async function act(what, path, body) {
    message.textContent = `${what}…`;
    try {
      await api(path, { method: "POST", ...(body ? { headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) } : {}) });
      message.textContent = `${what}: done`;
    } catch (err) {
      message.textContent = `${what} refused: ${err.message}`;
    }
    lastRows = "";
    view.wake();
  }

  const actions = (j) => {
    const tier = h("select", { testid: "queue-priority", "aria-label": `priority of job ${j.id}`,
      onchange: () => act(`job ${j.id} priority ${tier.value}`, `/jobs/${j.id}/priority`, { priority: tier.value }) },
    ...TIERS.map((t) => h("option", { value: t, selected: t === j.priority }, t)));
    const sure = h("button", { class: "danger small", testid: "queue-cancel-confirm", hidden: true,
      onclick: () => act(`cancel job ${j.id}`, `/jobs/${j.id}/cancel`) }, "Yes, cancel");
    const cancel = h("button", { class: "small", testid: "queue-cancel",
      onclick: () => { cancel.hidden = true; sure.hidden = false; } }, "Cancel…");
    return h("td", { class: "actions" }, tier, " ", cancel, sure);
  };

  view.poll(async () => {
    const [queue, run] = await Promise.all([
      api("/queue"),
      api("/jobs?state=RUNNING&limit=200&sort=id&order=asc"),
    ]);
    count.textContent = `${queue.jobs.length} waiting · ${run.total ?? run.jobs.length} running`;
    const rowsKey = JSON.stringify(queue.jobs); // redrawn only when it changed: a menu stays open
    if (rowsKey !== lastRows) {
      lastRows = rowsKey;
      rows.replaceChildren(...(queue.jobs.length ? queue.jobs.map((j) => h("tr", { testid: "queue-row", "data-job-id": j.id },
        h("td", { class: "num", testid: "queue-position" }, String(j.position)),
        h("td", { class: "num" }, h("a", { href: `#/jobs/${j.id}` }, String(j.id))),
        h("td", {}, h("a", { href: `#/jobs/${j.id}` }, j.name)),
        h("td", {}, j.owner),
        h("td", {}, timeCell(j.created_at)),
        h("td", { class: "reason", testid: "queue-reason" }, j.reason || "—"),
        actions(j)))
        : [h("tr", { class: "empty" }, h("td", { colspan: "7" }, "Nothing is waiting."))]));
    }
    running.replaceChildren(...(run.jobs.length ? run.jobs.map((j) => h("tr", { testid: "running-row", "data-job-id": j.id },
      h("td", { class: "num" }, h("a", { href: `#/jobs/${j.id}` }, String(j.id))),
      h("td", {}, h("a", { href: `#/jobs/${j.id}` }, j.name)),
      h("td", {}, j.owner),
      h("td", {}, j.priority),
      h("td", {}, progressCell(j)),
      h("td", {}, placementText(j.placement)),
      h("td", {}, j.started_at ? fmtDuration(Date.now() / 1000 - j.started_at) : "—")))
      : [h("tr", { class: "empty" }, h("td", { colspan: "7" }, "Nothing is running."))]));
    preempting.replaceChildren(...(queue.preempting || []).map((p) => h("p", { class: "warn" },
      `Job #${p.id} ${p.name} (${p.owner}) is asked to yield: ${p.reason || ""}`)));
  }, POLL_MS);
  const head = (cols) => h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c))));
  return h("section", { class: "page queue" },
    h("div", { class: "toolbar" }, h("h1", {}, "Queue"), count, message),
    preempting,
    h("section", { class: "card" }, h("h2", {}, "Waiting, in the order the scheduler considers them"),
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "queue-table" },
        head(["Position", "ID", "Name", "Owner", "Submitted", "Why it waits", "Priority"]), rows))),
    h("section", { class: "card" }, h("h2", {}, "Running"),
      h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "running-table" },
        head(["ID", "Name", "Owner", "Priority", "Progress", "Placement", "Running for"]), running))));
}

// -------------------------------------------------------------------------------------- nodes

export const NODE_KNOWN = new Set(["name", "cpus", "memory_bytes", "gpus", "free_cpus", "free_gpus",
  "cpu_percent", "memory_used_bytes", "gpus_live", "sampled_at"]);
export const GPU_KNOWN = new Set(["index", "model", "memory_bytes"]);

export function meter(frac, text, testid) {
  const pct = Math.max(0, Math.min(1, frac || 0)) * 100;
  return h("div", { class: "meter", testid, title: text },
    h("div", { class: `fill${pct > 90 ? " hot" : pct > 70 ? " warm" : ""}`, style: `width:${pct.toFixed(1)}%` }),
    h("span", {}, text));
}

/** A field of the monitoring sampler this page has no special place for, shown by its name. */
export function liveValue(key, value) {
  if (typeof value === "number") {
    if (/percent|util/i.test(key)) {
      const pct = value <= 1 && !/percent/i.test(key) ? value * 100 : value;
      return meter(pct / 100, `${pct.toFixed(1)}%`, `live-${key}`);
    }
    if (/bytes/i.test(key)) return fmtBytes(value);
    if (/(^|_)(at|time)$/i.test(key) && value > 1e9) return timeCell(value);
    return fmtNum(value);
  }
  if (value && typeof value === "object") return h("span", { class: "mono small" }, JSON.stringify(value));
  return value === null || value === undefined ? "—" : String(value);
}

export function fieldLabel(key) {
  return key.replace(/_/g, " ").replace(/\bbytes\b/, "").trim();
}

export function gpuTable(node) {
  const gpus = node.gpus || [];
  if (!gpus.length) return null;
  const freeGpus = new Set(node.free_gpus || []);
  const live = new Map((node.gpus_live || []).map((g) => [g.index, g]));
  const extraKeys = [...new Set(gpus.flatMap((g) => Object.keys(g)))].filter((k) => !GPU_KNOWN.has(k));
  const hasLive = live.size > 0;
  const head = ["GPU", "Model", "Allocated", ...(hasLive ? ["Utilization", "Memory used", "Power", "Temperature"] : ["Memory"]),
    ...extraKeys.map(label)];
  return h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "gpu-table" },
    h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))),
    h("tbody", {}, gpus.map((g) => {
      const l = live.get(g.index) || {};
      const fbUsed = typeof l.fb_used === "number" ? l.fb_used * 1024 * 1024 : null; // DCGM: MiB
      return h("tr", { testid: "gpu-row", "data-gpu": g.index },
        h("td", { class: "num" }, String(g.index)),
        h("td", {}, g.model || "—"),
        h("td", {}, freeGpus.has(g.index) ? "free" : "in use"),
        ...(hasLive ? [
          h("td", {}, typeof l.util === "number" ? meter(l.util / 100, `${l.util.toFixed(0)}%`, "gpu-util") : "—"),
          h("td", {}, fbUsed === null ? "—" : g.memory_bytes
            ? meter(fbUsed / g.memory_bytes, `${fmtBytes(fbUsed)} / ${fmtBytes(g.memory_bytes)}`, "gpu-memory")
            : fmtBytes(fbUsed)),
          h("td", { class: "num" }, typeof l.power === "number" ? `${fmtNum(l.power)} W` : "—"),
          h("td", { class: "num" }, typeof l.temp === "number" ? `${fmtNum(l.temp)} °C` : "—"),
        ] : [h("td", {}, fmtBytes(g.memory_bytes))]),
        ...extraKeys.map((k) => h("td", {}, liveValue(k, g[k]))));
    }))));
}

export function nodeCard(node, metricsGrid) {
  const used = node.cpus - node.free_cpus;
  const gpus = node.gpus || [];
  const freeGpus = new Set(node.free_gpus || []);
  const other = Object.entries(node).filter(([k, v]) => !NODE_KNOWN.has(k) && !Array.isArray(v));
  const cpu = typeof node.cpu_percent === "number" ? node.cpu_percent : null;
  const mem = typeof node.memory_used_bytes === "number" ? node.memory_used_bytes : null;
  return h("section", { class: "card node", testid: "node-card", "data-node": node.name },
    h("div", { class: "card-head" }, h("h2", {}, node.name), h("span", { class: "spacer" }),
      node.sampled_at ? h("span", { class: "muted small", testid: "node-sampled" }, "sampled ", timeCell(node.sampled_at)) : null),
    h("dl", { class: "summary" },
      ...kv("CPU cores allocated", meter(node.cpus ? used / node.cpus : 0, `${used} / ${node.cpus} (${node.free_cpus} free)`, "node-cpus")),
      ...kv("GPUs allocated", gpus.length ? meter((gpus.length - freeGpus.size) / gpus.length,
        `${gpus.length - freeGpus.size} / ${gpus.length}`, "node-gpus") : "none"),
      ...(cpu === null ? [] : kv("CPU use", meter(cpu / 100, `${cpu.toFixed(1)}%`, "node-cpu-percent"))),
      ...kv("Memory", mem === null ? fmtBytes(node.memory_bytes)
        : meter(node.memory_bytes ? mem / node.memory_bytes : 0, `${fmtBytes(mem)} / ${fmtBytes(node.memory_bytes)}`, "node-memory")),
      ...other.flatMap(([k, v]) => kv(fieldLabel(k), liveValue(k, v), `node-${k}`))),
    gpuTable(node),
    metricsGrid);
}

const bundleText = (b) => Object.entries(b).map(([k, v]) => `${fmtNum(v)} ${k}`).join(" + ");

/** The cluster's autoscaler (its node types, the jobs asked for, the last requests) and the
 * nodes that joined and left lately; nothing for an executor that says neither. */
export function clusterPanel(data) {
  const events = data.node_events || [];
  const scaler = data.autoscaler;
  if (!events.length && !scaler) return null;
  const parts = [];
  if (scaler) {
    const types = scaler.node_types.map((t) => {
      const coming = scaler.launching[t.name];
      return `${t.name} (${t.cpus} CPU${t.gpus ? `, ${t.gpus} GPU` : ""}): ${t.up} of ${t.max_workers}`
        + (coming ? `, ${coming} launching` : "");
    }).join(" · ");
    parts.push(h("dl", { class: "summary", testid: "autoscaler" },
      ...kv("Node types", types, "autoscaler-types"),
      ...kv("Read from", scaler.source),
      ...kv("Asked for", scaler.asked.length ? h("span", {}, ...scaler.asked.flatMap((a, i) => [i ? ", " : "",
        h("a", { href: `#/jobs/${a.job}` }, `job ${a.job}`),
        a.nodes ? `: ${a.nodes} node(s) of ${a.node_type} ` : `: room on a ${a.node_type} asked for `,
        timeCell(a.since)])) : "nothing", "autoscaler-asked")));
    if (scaler.requests.length) {
      parts.push(h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "autoscaler-requests" },
        h("thead", {}, h("tr", {}, ["Requested", "Bundles", "For jobs"].map((c) => h("th", {}, c)))),
        h("tbody", {}, [...scaler.requests].reverse().map((r) => h("tr", { testid: "autoscaler-request" },
          h("td", {}, timeCell(r.at)),
          h("td", { class: "mono small" }, r.bundles.length ? r.bundles.map(bundleText).join(", ") : "nothing (withdrawn)"),
          h("td", {}, r.jobs.join(", ") || "—")))))));
    }
  }
  if (events.length) {
    parts.push(h("div", { class: "table-wrap" }, h("table", { class: "grid", testid: "node-events" },
      h("thead", {}, h("tr", {}, ["When", "Node", "Event", "Type", "CPU", "GPUs"].map((c) => h("th", {}, c)))),
      h("tbody", {}, [...events].reverse().map((e) => h("tr", { testid: "node-event", "data-event": e.event },
        h("td", {}, timeCell(e.at)), h("td", {}, e.node), h("td", {}, e.event), h("td", {}, e.node_type || "—"),
        h("td", { class: "num" }, String(e.cpus)), h("td", { class: "num" }, String(e.gpus))))))));
  }
  return h("section", { class: "card", testid: "cluster-panel" },
    h("div", { class: "card-head" }, h("h2", {}, scaler ? "Autoscaler and node events" : "Node events")), ...parts);
}

export function nodesPage(view) {
  const cards = h("div", { class: "nodes", testid: "nodes" });
  const cluster = h("div", { testid: "cluster" });
  const executor = h("span", { class: "muted", testid: "executor" });
  const histories = new Map(); // node -> {grid, charts, missing}
  view.poll(async () => {
    const data = await api("/nodes");
    executor.textContent = `executor: ${data.executor}`;
    const panel = clusterPanel(data);
    cluster.replaceChildren(...(panel ? [panel] : []));
    let added = false;
    cards.replaceChildren(...data.nodes.map((n) => {
      if (!histories.has(n.name)) {
        const grid = h("div", { class: "charts", testid: "node-charts" });
        histories.set(n.name, { grid, charts: new ChartGrid(grid, "node-chart-", { smoothing: 0, log: false }), missing: false });
        added = true;
      }
      return nodeCard(n, histories.get(n.name).grid);
    }));
    if (added) historyPoller.now();
  }, POLL_MS);
  const historyPoller = view.poll(async () => {
    let any = false;
    for (const [name, hist] of histories) {
      if (hist.missing) continue;
      try {
        const series = systemSeries(await api(`/nodes/${encodeURIComponent(name)}/metrics`));
        drawSystem(hist.charts, series.filter((x) => x.name !== "memory_total_bytes")); // flat line
        any = true;
      } catch (err) {
        if (err instanceof ApiError && (err.status === 404 || err.status === 405)) hist.missing = true;
        else throw err;
      }
    }
    return any || histories.size === 0;
  }, POLL_MS * 2.5);
  return h("section", { class: "page nodes-page" },
    h("div", { class: "toolbar" }, h("h1", {}, "Nodes"), executor), cluster, cards);
}
