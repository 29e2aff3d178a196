"""The server's own Prometheus metrics, served at ``GET /metrics``.

Each app has its own :class:`Telemetry` with its own ``CollectorRegistry`` (never
prometheus_client's global one, so two apps in one process do not clash). Counters and the
decision-time histogram are updated where things happen; everything else is read when scraped:

========================================== ======= =============================================
``trainhouse_jobs{state}``                 gauge   jobs in each state
``trainhouse_queue_length{priority}``      gauge   queued jobs per priority tier
``trainhouse_gpus{node,state}``            gauge   GPUs ``allocated`` to running jobs / ``free``
``trainhouse_cpus{node,state}``            gauge   CPU cores ``allocated`` / ``free``
``trainhouse_scheduler_decision_seconds``  histo   time of each scheduling decision (policy)
``trainhouse_metric_points_ingested_total`` counter metric points stored from jobs' reports
``trainhouse_node_cpu_percent{node}``      gauge   the latest resource sample (if recent) ...
``trainhouse_node_memory_used_bytes``      gauge   ... and ``_memory_total_bytes``
``DCGM_FI_DEV_*{node,gpu}``                gauge   GPU utilisation, FB used/free (MiB), power
                                                   (W), temperature (C), as dcgm-exporter names
``trainhouse_job_cpu_percent{job_id}``     gauge   running jobs' processes: CPU (of one core),
``trainhouse_job_rss_bytes{job_id}``       gauge   resident memory, and
``trainhouse_job_gpu_memory_bytes``        gauge   GPU memory per ``gpu``
========================================== ======= =============================================
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainhouse.core import metricnames as names
from trainhouse.core.lifecycle import JobState
from trainhouse.core.spec import PRIORITY_TIERS
from trainhouse.executors.base import Executor
from trainhouse.jobfs.nvml import GPU_METRICS
from trainhouse.store import Store
from trainhouse.store.system import SystemMetrics

DECISION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# one family per GPU metric the sampler takes (trainhouse.jobfs.nvml.GPU_METRICS)
GPU_HELP = {metric.name: metric.help for metric in GPU_METRICS}


class Telemetry:
    """One app's registry, counters and histogram."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.points = Counter(
            "trainhouse_metric_points_ingested",
            "Metric points stored from jobs' reports.",
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "trainhouse_scheduler_decision_seconds",
            "Time the scheduling policy took for one decision over the queue.",
            buckets=DECISION_BUCKETS,
            registry=self.registry,
        )

    def watch(
        self, store: Store, system: SystemMetrics, executor: Executor, *, stale_after: float
    ) -> None:
        """Expose the jobs, the resources and the latest samples too, read at each scrape."""
        self.registry.register(ServerCollector(store, system, executor, stale_after=stale_after))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ServerCollector(Collector):
    """Gauges read from the store and the executor when ``/metrics`` is scraped."""

    def __init__(
        self, store: Store, system: SystemMetrics, executor: Executor, *, stale_after: float
    ) -> None:
        self.store = store
        self.system = system
        self.executor = executor
        self.stale_after = stale_after  # seconds after which a node's sample is not exposed

    def describe(self) -> Iterable[Metric]:
        return []  # names are not claimed in the registry: collect() runs only when scraped

    def collect(self) -> Iterable[Metric]:
        jobs = GaugeMetricFamily("trainhouse_jobs", "Jobs in each state.", labels=["state"])
        for state, count in sorted(self.system.jobs_by_state().items()):
            jobs.add_metric([state], count)
        yield jobs

        queue = GaugeMetricFamily(
            "trainhouse_queue_length", "Queued jobs per priority tier.", labels=["priority"]
        )
        queued = {tier: 0 for tier in PRIORITY_TIERS}
        queued.update(self.system.queued_by_priority())
        for tier, count in queued.items():
            queue.add_metric([tier], count)
        yield queue

        running = self.store.jobs.list(states=[JobState.RUNNING])
        nodes = self.executor.nodes()
        used_cpus = {n.name: 0 for n in nodes}
        used_gpus: dict[str, set[int]] = {n.name: set() for n in nodes}
        for job in running:
            for placement in job.placement:
                if placement.node in used_cpus:
                    used_cpus[placement.node] += placement.cpus
                    used_gpus[placement.node].update(placement.gpus)
        gpus = GaugeMetricFamily(
            "trainhouse_gpus", "GPUs allocated to running jobs or free.", labels=["node", "state"]
        )
        cpus = GaugeMetricFamily(
            "trainhouse_cpus",
            "CPU cores allocated to running jobs or free.",
            labels=["node", "state"],
        )
        for n in nodes:
            allocated = len(used_gpus[n.name] & {g.index for g in n.gpus})
            gpus.add_metric([n.name, "allocated"], allocated)
            gpus.add_metric([n.name, "free"], len(n.gpus) - allocated)
            cpus.add_metric([n.name, "allocated"], min(used_cpus[n.name], n.cpus))
            cpus.add_metric([n.name, "free"], max(n.cpus - used_cpus[n.name], 0))
        yield gpus
        yield cpus

        yield from self._nodes([n.name for n in nodes])
        yield from self._jobs([j.id for j in running])

    def _nodes(self, nodes: list[str]) -> Iterable[Metric]:
        cpu = GaugeMetricFamily(
            "trainhouse_node_cpu_percent", "CPU use of all cores (in %).", labels=["node"]
        )
        used = GaugeMetricFamily(
            "trainhouse_node_memory_used_bytes", "Memory used (total - available).", labels=["node"]
        )
        total = GaugeMetricFamily("trainhouse_node_memory_total_bytes", "Memory.", labels=["node"])
        gpu = {
            name: GaugeMetricFamily(name, text, labels=["node", "gpu"])
            for name, text in GPU_HELP.items()
        }
        now = time.time()
        for node in nodes:
            latest = self.system.latest(node=node)
            if latest is None or now - latest.at > self.stale_after:
                continue
            for family, name in ((cpu, names.CPU_PERCENT), (used, names.MEMORY_USED)):
                value = latest.value(name)
                if value is not None:
                    family.add_metric([node], value)
            value = latest.value(names.MEMORY_TOTAL)
            if value is not None:
                total.add_metric([node], value)
            for s in latest.samples:
                if s.gpu is not None and s.name in gpu:
                    gpu[s.name].add_metric([node, str(s.gpu)], s.value)
        yield cpu
        yield used
        yield total
        for family in gpu.values():
            if family.samples:  # a GPU-less node has none: not even the names
                yield family

    def _jobs(self, job_ids: list[int]) -> Iterable[Metric]:
        cpu = GaugeMetricFamily(
            "trainhouse_job_cpu_percent",
            "CPU use of a running job's processes (in % of one core).",
            labels=["job_id"],
        )
        rss = GaugeMetricFamily(
            "trainhouse_job_rss_bytes",
            "Resident memory of a running job's processes.",
            labels=["job_id"],
        )
        gpu = GaugeMetricFamily(
            "trainhouse_job_gpu_memory_bytes",
            "GPU memory of a running job's processes.",
            labels=["job_id", "gpu"],
        )
        now = time.time()
        for job_id in job_ids:
            latest = self.system.latest(job_id=job_id)
            if latest is None or now - latest.at > self.stale_after:
                continue
            for family, name in ((cpu, names.CPU_PERCENT), (rss, names.RSS)):
                value = latest.value(name)
                if value is not None:
                    family.add_metric([str(job_id)], value)
            for s in latest.samples:
                if s.name == names.GPU_MEMORY and s.gpu is not None:
                    gpu.add_metric([str(job_id), str(s.gpu)], s.value)
        yield cpu
        yield rss
        if gpu.samples:
            yield gpu
