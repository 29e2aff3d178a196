"""Resource monitoring: what the server samples of its nodes and jobs, and what it exports.

============================  ===============================================================
:mod:`.names`                 the sampled series' names and units (node, job, DCGM's for GPUs)
:mod:`.nvml`                  NVIDIA's management library, once: the GPUs a node has, and each
                              GPU's values as a table of metrics (:data:`.nvml.GPU_METRICS`)
:mod:`.sampler`               the service that samples every few seconds into the store
:mod:`.telemetry`             the server's Prometheus metrics (``GET /metrics``)
============================  ===============================================================

``names`` and ``nvml`` sit at the bottom (the store and the executors use them); ``sampler`` and
``telemetry`` read the store and the executor, beside the scheduler.
"""
