"""Random number generator states, stored in a checkpoint so a resumed run draws the same numbers.

A state is a dict of python ints, tuples and uint8/int64 tensors only, so that a checkpoint
holding it loads with a plain ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import logging
import random
from typing import Any

log = logging.getLogger("trainhouse")


def capture() -> dict[str, Any]:
    """This process's RNG states: python ``random``, numpy's global one, torch CPU and CUDA."""
    import torch

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": (int(version), torch.tensor(internal, dtype=torch.int64), gauss),
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        legacy = np.random.get_state(legacy=True)
        if isinstance(legacy, tuple) and legacy[0] == "MT19937":
            kind, keys, pos, has_gauss, cached = legacy
            state["numpy"] = (
                str(kind),
                torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                int(pos),
                int(has_gauss),
                float(cached),
            )
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore(state: dict[str, Any]) -> None:
    """Set this process's RNG states from :func:`capture`'s dict (what is missing stays)."""
    import torch

    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((int(version), tuple(int(v) for v in internal.tolist()), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            log.warning("trainhouse: the checkpoint has a numpy RNG state but numpy is missing")
        else:
            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state(
                (kind, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached))
            )
    cuda = state.get("cuda")
    if cuda:
        if not torch.cuda.is_available():
            log.warning("trainhouse: the checkpoint has CUDA RNG states but CUDA is unavailable")
        elif len(cuda) != torch.cuda.device_count():
            log.warning(
                "trainhouse: the checkpoint has CUDA RNG states for %d devices, this process "
                "sees %d; CUDA RNG states not restored",
                len(cuda),
                torch.cuda.device_count(),
            )
        else:
            torch.cuda.set_rng_state_all(cuda)


def restore_rank(states: Any, rank: int, world_size: int) -> bool:
    """Restore ``rank``'s state from the per-rank list saved with the checkpoint.

    When the world size changed, ranks that have no saved state restore nothing (warned).
    """
    if not isinstance(states, list | tuple):
        return False
    if len(states) != world_size and rank == 0:
        log.warning(
            "trainhouse: the checkpoint holds RNG states of %d ranks, this run has %d; "
            "ranks without a saved state keep their current RNG state",
            len(states),
            world_size,
        )
    if rank >= len(states) or not isinstance(states[rank], dict):
        return False
    restore(states[rank])
    return True
