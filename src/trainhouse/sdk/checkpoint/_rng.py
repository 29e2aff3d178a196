"""Random number generator states, stored in a checkpoint so a resumed run draws the same numbers.

A state is a dict of python ints, tuples and uint8/int64 tensors only, so that a checkpoint
holding it loads with a plain ``torch.load(weights_only=True)``. In a process that has not
imported torch (a script of scikit-learn's, say) there is no torch state to keep, and the rest
is kept as python ints and lists: saving a checkpoint does not import torch for them.
"""

from __future__ import annotations

import logging
import random
import sys
from typing import Any

log = logging.getLogger("trainhouse")


def capture() -> dict[str, Any]:
    """This process's RNG states: python ``random``, numpy's global one, torch CPU and CUDA
    (torch's and numpy's where the process imported them: one that did not has drawn nothing
    from them)."""
    torch: Any = sys.modules.get("torch")
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": (int(version), _ints(torch, internal), gauss),
    }
    if torch is not None:
        state["torch"] = torch.get_rng_state()
    np: Any = sys.modules.get("numpy")
    if np is not None:
        legacy = np.random.get_state(legacy=True)
        if isinstance(legacy, tuple) and legacy[0] == "MT19937":
            kind, keys, pos, has_gauss, cached = legacy
            state["numpy"] = (
                str(kind),
                _ints(torch, [int(k) for k in keys]),
                int(pos),
                int(has_gauss),
                float(cached),
            )
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def _ints(torch: Any, values: Any) -> Any:
    """``values`` (python ints) as an int64 tensor, or as a list where torch is not imported."""
    if torch is None:
        return [int(v) for v in values]
    return torch.tensor(values, dtype=torch.int64)


def _listed(values: Any) -> list[int]:
    """A saved list of ints back as python ints (a tensor of them, or a list)."""
    return [int(v) for v in (values if isinstance(values, list | tuple) else values.tolist())]


def restore(state: dict[str, Any]) -> None:
    """Set this process's RNG states from :func:`capture`'s dict (what is missing stays)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((int(version), tuple(_listed(internal)), gauss))
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            log.warning("trainhouse: the checkpoint has a numpy RNG state but numpy is missing")
        else:
            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state(
                (
                    kind,
                    np.asarray(_listed(keys), dtype=np.uint32),
                    int(pos),
                    int(has_gauss),
                    float(cached),
                )
            )
    cuda = state.get("cuda")
    if cuda:
        import torch

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
