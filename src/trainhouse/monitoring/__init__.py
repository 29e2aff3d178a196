"""Resource monitoring: what the server samples of its nodes and jobs, and what it exports.

============================  ===============================================================
:mod:`.sampler`               the loop that samples every few seconds into the store
:mod:`.telemetry`             the server's Prometheus metrics (``GET /metrics``)
============================  ===============================================================

Both read the store and the executor, beside the scheduler. What the store and the executors
need of monitoring sits at the bottom layer: the sampled series' names and units in
:mod:`trainhouse.core.metricnames`, NVIDIA's management library (the GPUs a node has, each GPU's
values as a table of metrics) in :mod:`trainhouse.jobfs.nvml`.
"""
