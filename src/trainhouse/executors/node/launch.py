"""Runs a module as ``python -m MODULE ARGS...`` does, then ends without collecting its heap:
``python -m trainhouse.executors.node.launch MODULE ARGS...``.

The supervisor starts torchrun through it (``... launch torch.distributed.run ...``). A process
that imported torch spends most of a second at exit in the interpreter's last garbage
collections over torch's objects, and the attempt's end waits for torchrun's: with the heap
frozen (:func:`gc.freeze`) once the module has returned or raised, the interpreter's
finalization skips them. Everything else about the exit is as it was: ``atexit`` handlers run,
objects no cycle holds are freed as their modules are cleared, the exit code and a traceback
are the module's. Imports the standard library only.
"""

from __future__ import annotations

import gc
import runpy
import sys

USAGE = "usage: python -m trainhouse.executors.node.launch MODULE [ARGS...]"


def main(argv: list[str]) -> None:
    if not argv:
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    module, *args = argv
    sys.argv = [module, *args]  # runpy puts the module's file in sys.argv[0], as -m does
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        gc.freeze()


if __name__ == "__main__":
    main(sys.argv[1:])
