"""The bottom layer's side that touches the OS: a job's files and the machine under them.

====================  ============================================================================
:mod:`.layout`        a job's files (logs, checkpoints, attempts, spool, ...) and the
                      ``TRAINHOUSE_*`` environment (``JobEnv``)
:mod:`.jobfiles`      opening what a job's processes wrote: no link followed, regular files only,
                      bounded reads
:mod:`.joblogs`       reading logs: byte ranges, last lines, timestamps, every rank interleaved
:mod:`.artifacts`     a job's artifacts: path rules, the confined listing, one opened, sniffed
:mod:`.workdir`       packing and safely unpacking workdirs
:mod:`.storage`       checkpoint storage: a directory or any fsspec URL; the digest algorithms
:mod:`.envcache`      the cache of job environments on one node (ready, in use, LRU removal)
:mod:`.datasources`   where a dataset version's files come from: URLs checked, listed, hashed, read
:mod:`.sourcecheck`  a dataset source as a request gives it: URL, host, storage options checked
:mod:`.datacache`     a node's cache of staged dataset versions (by content digest, read-only trees)
:mod:`.cachefiles`   the datacache's file operations: flocks, no-follow directories, hard links
:mod:`.durable`       fsync of files and directories
:mod:`.hardening`     non-dumpable processes, the child subreaper, the private umask, secrets
:mod:`.nvml`          NVIDIA's management library, once: a node's GPUs and each GPU's values
====================  ============================================================================

These import ``trainhouse.core`` and nothing else of trainhouse (a contract).
"""
