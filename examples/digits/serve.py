"""The function that rebuilds the digits CNN for serving and exports, from a checkpoint's state
or a saved model's weights:

    trainhouse models register digits --job 7 --loader serve.py:load --input x:float32[B,1,8,8]
    trainhouse models export digits@1 --format onnx out/ --workdir examples/digits
"""

from __future__ import annotations

from typing import Any

from torch import nn
from train import DigitsCNN


def load(state: dict[str, Any]) -> nn.Module:
    """The CNN with the weights of ``state``: a checkpoint's (its ``model`` entry, what
    ``train.py`` saves) or a state_dict."""
    model = DigitsCNN()
    model.load_state_dict(state.get("model", state))
    return model.eval()
