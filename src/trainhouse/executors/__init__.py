"""Executors turn placements into processes: ``local`` (torchrun on this machine) and ``ray``
(placement groups on a Ray cluster), named in :mod:`trainhouse.executors.registry`; the protocol
they implement is :mod:`trainhouse.executors.base`. Nothing is imported here, so that naming the
executors (``trainhouse server --help``) loads none of them."""
