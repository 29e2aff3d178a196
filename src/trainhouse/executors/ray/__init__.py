"""The Ray executor: placement groups on a Ray cluster (``executor``), one attempt's actors and
their end (``attempt``), and the actor on each node that runs the node's process tree
(``node``). Imported only when ``--executor ray`` is chosen (``executors.registry``)."""
