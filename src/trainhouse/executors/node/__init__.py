"""The process tree of one node: the supervisor of an attempt (``supervise``), torchrun through
a launcher (``launch``, ``torchrun``), the rank wrappers (``rank``), finding every process of
an attempt (``markers``, ``cgroups``), when a stopped attempt gets its signals (``stopping``),
and the job environment built before torchrun starts (``envbuild``). The local and the Ray
executor both run it."""
