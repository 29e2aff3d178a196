// A job's size: its resources in words (an elastic job's current ranks and its range), the
// ranks each attempt ran, and its world size over time, the chart a job's page draws for an
// elastic job or one whose attempts ran at different sizes (each resize marked, its reason on
// hover).
import { drawChart, pageColors } from "./charts.js";
import { TERMINAL, h } from "./core.js";

/** [MIN, MAX] of a spec's size: 4 is [4, 4], "2:8" (an elastic one) is [2, 8]. */
export function sizeRange(value, fallback = 1) {
  if (value === null || value === undefined || value === "") return [fallback, fallback];
  const parts = String(value).split(":").map((v) => parseInt(v, 10));
  if (parts.some((v) => !Number.isFinite(v))) return [fallback, fallback];
  return [parts[0], parts[parts.length - 1]];
}

/** Whether the spec's size is a range: the scheduler may resize the job at checkpoints. */
export function isElastic(spec) {
  const r = (spec && spec.resources) || {};
  return [r.nodes, r.procs_per_node, r.gpus_per_node].some((v) => typeof v === "string" && v.includes(":"));
}

/** [least, most] ranks of the job's world: nodes × ranks per node, each at its least, its most. */
export function worldRange(spec) {
  const r = (spec && spec.resources) || {};
  const [nLeast, nMost] = sizeRange(r.nodes);
  const [pLeast, pMost] = sizeRange(r.procs_per_node || r.gpus_per_node || 1);
  return [nLeast * pLeast, nMost * pMost];
}

/** The ranks a placement ({nodes: [{node, procs}]}) runs, null when it names none. */
export function placementRanks(placement) {
  const nodes = placement && Array.isArray(placement.nodes) ? placement.nodes : null;
  if (!nodes || !nodes.length) return null;
  return nodes.reduce((sum, n) => sum + (Number(n.procs) || 1), 0);
}

/** The ranks an attempt ran (its world size), null when its placement is not known. */
export function attemptRanks(attempt) {
  return placementRanks(attempt && attempt.placement);
}

/** The placement the job runs at now; an ended job's last one. */
function currentPlacement(job) {
  if (job.placement) return job.placement;
  const last = (job.attempt_history || []).at(-1);
  return TERMINAL.has(job.state) && last ? last.placement : null;
}

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/** A job's resources as people read them: "1 node × 2 ranks, CPU only, 1 CPU/rank"; an
 * elastic job its ranks now and their range, "4 ranks (2:8) on 1 node, ..." ("2:8 ranks"
 * while it runs at no size). */
export function resourcesText(job) {
  const spec = job && job.spec;
  const r = (spec && spec.resources) || {};
  const parts = [];
  if (isElastic(spec)) {
    const [nLeast, nMost] = sizeRange(r.nodes);
    const range = worldRange(spec).join(":");
    const placement = currentPlacement(job);
    const ranks = placementRanks(placement);
    const nodes = ranks === null ? null : placement.nodes.length;
    const rankPart = ranks === null ? `${range} ranks` : `${plural(ranks, "rank")} (${range})`;
    const nodePart = nLeast === nMost ? plural(nLeast, "node")
      : nodes === null ? `${nLeast}:${nMost} nodes` : `${plural(nodes, "node")} (${nLeast}:${nMost})`;
    parts.push(`${rankPart} on ${nodePart}`);
    const gpus = String(r.gpus_per_node || 0);
    parts.push(gpus.includes(":") ? "1 GPU/rank" : gpus !== "0" ? `${gpus} GPU/node` : "CPU only");
  } else {
    const procs = r.procs_per_node || r.gpus_per_node || 1;
    parts.push(`${plural(r.nodes || 1, "node")} × ${plural(procs, "rank")}`);
    parts.push(r.gpus_per_node ? `${r.gpus_per_node} GPU/node` : "CPU only");
  }
  if (r.cpus_per_proc) parts.push(`${r.cpus_per_proc} CPU/rank`);
  return parts.join(", ");
}

/** Whether the job's page charts its size: an elastic job, or one whose attempts ran at
 * different sizes, once an attempt has a size. */
export function showsSizes(job) {
  const sizes = new Set((job.attempt_history || []).map(attemptRanks).filter((n) => n !== null));
  return sizes.size > 0 && (isElastic(job.spec) || sizes.size > 1);
}

/**
 * The world size over time as chart traces: "ranks", a step line from each attempt's start to
 * its end (or now, for the running one; a gap between attempts, when no rank ran), its hover
 * saying which attempt (its end, how it ended and why); "resizes", a marker where each resize
 * ended an attempt, its reason on hover; and marks (dashed lines) at the resize times, labelled
 * "4→2". Times in ms (a date axis, as the system charts).
 */
export function sizeSeries(job, now = Date.now() / 1000) {
  const ranks = { name: "ranks", x: [], y: [], text: [], shape: "hv" };
  const resizes = { name: "resizes", x: [], y: [], text: [], mode: "markers", symbol: "diamond" };
  const marks = [];
  const attempts = (job.attempt_history || []).filter((a) => attemptRanks(a) !== null);
  attempts.forEach((a, i) => {
    const n = attemptRanks(a);
    const end = a.ended_at ?? (TERMINAL.has(job.state) ? job.ended_at ?? now : now);
    if (ranks.x.length) {
      ranks.x.push(null);
      ranks.y.push(null);
      ranks.text.push(null);
    }
    const what = `attempt ${a.number}: ${plural(n, "rank")}`;
    ranks.x.push(a.started_at * 1000, end * 1000);
    ranks.y.push(n, n);
    // its end says how it ended and why (a resize's reason: the marker there says it too)
    const why = (a.reason || "").split("\n")[0];
    const ended = `${what}, ${a.result || "ended"}${why ? `: ${why.length > 120 ? `${why.slice(0, 119)}…` : why}` : ""}`;
    ranks.text.push(`${what}, started`, a.ended_at ? ended : `${what}, running`);
    if (a.result !== "resized") return;
    const next = attempts[i + 1] ? attemptRanks(attempts[i + 1]) : null;
    const told = /(\d+)\s*->\s*(\d+)/.exec(a.reason || "");
    const to = next ?? (told ? Number(told[2]) : null);
    resizes.x.push(end * 1000);
    resizes.y.push(n);
    resizes.text.push(`resized ${n}→${to ?? "?"}: ${a.reason || "no reason given"}`);
    marks.push({ x: end * 1000, label: to === null ? "resize" : `${n}→${to}` });
  });
  return { traces: resizes.x.length ? [ranks, resizes] : [ranks], marks };
}

/** The job page's card: hidden (no empty card) until showsSizes(job); update(job) redraws. */
export function sizeCard() {
  const chart = h("div", { class: "chart", testid: "world-size-chart" });
  const note = h("p", { class: "muted small", testid: "world-size-note" });
  const el = h("section", { class: "card", testid: "world-size-section", hidden: true },
    h("h2", {}, "World size"), note, chart);
  const update = (job) => {
    if (!job || !showsSizes(job)) {
      el.hidden = true;
      return;
    }
    el.hidden = false; // shown before drawing, so the chart gets its width
    const { traces, marks } = sizeSeries(job);
    traces[0].color = pageColors().accent; // the page's own blue: a light one in the dark
    const [least, most] = worldRange(job.spec);
    const resized = marks.length;
    note.textContent = (isElastic(job.spec) ? `Elastic: ${least} to ${most} ranks. ` : "") +
      (resized ? `Resized ${resized === 1 ? "once" : `${resized} times`}: hover a ◆ for the reason.` : "Not resized so far.");
    const top = Math.max(most, ...traces[0].y.filter((v) => v !== null));
    drawChart(chart, "ranks over time", traces, {
      smoothing: 0, log: false, legend: false, xType: "date", xTitle: "", marks, height: 240,
      yaxis: { title: { text: "ranks" }, range: [-0.4, top + 0.6], // 0 clear of the time axis' labels
         ...(top <= 12 ? { dtick: 1 } : { tickformat: "d" }) },
    });
  };
  return { el, update };
}
