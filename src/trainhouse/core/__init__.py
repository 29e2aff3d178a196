"""The bottom layer's pure part: the rules and types every other package shares.

================  ==============================================================================
:mod:`.errors`    the one exception tree (each error's code and HTTP status)
:mod:`.lifecycle` job states and the transition table; attempt results, failure kinds, stop reasons
:mod:`.cluster`   nodes, GPUs, placements (and their stored form)
:mod:`.spec`      the job spec (pydantic), YAML with line numbers, ``--set``
:mod:`.searchspec` a search's part of the spec: the ``search:`` block, distributions
:mod:`.envspec`   a job environment's request, its digest's inputs, what the launcher's log says
:mod:`.runquery`  the runs table's expression language (``--where``)
:mod:`.records`   the entities the store hands out (jobs, attempts, checkpoints, models, ...)
:mod:`.reports`   metric reports: parsing and limits (the report route, MLflow, TensorBoard)
:mod:`.modelfiles` a saved model's files, record, name and ref rules
:mod:`.tokens`    API tokens and job credentials: making, hashing, parsing
:mod:`.metricnames` the names and units of the sampled resource series
:mod:`.background` the base of the server's background loops (a thread that ticks)
:mod:`.wire`      how a request and its error cross between a server and its clients (httpx)
================  ==============================================================================

Nothing here imports anything of trainhouse outside ``core`` (a contract in ``pyproject.toml``),
and nothing is imported by this ``__init__``: the supervisor and the SDK import single modules.
"""
