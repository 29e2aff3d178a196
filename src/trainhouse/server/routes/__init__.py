"""One module per resource: each parses a request, calls a use case (:mod:`trainhouse.usecases`)
and renders its answer (jobs, lineage, logs, report (the SDK's endpoints), runs, queue, accounts,
envs, searches, models, services, system)."""
