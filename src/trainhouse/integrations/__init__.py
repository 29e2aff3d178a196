"""Integrations of trainhouse with training frameworks: a script that trains with the Hugging
Face ``Trainer`` or with PyTorch Lightning reports to its job by adding one callback.

- :mod:`trainhouse.integrations.transformers`: ``TrainhouseCallback`` (``pip install
  trainhouse[transformers]``);
- :mod:`trainhouse.integrations.lightning`: ``TrainhouseLogger`` and ``TrainhouseCallback``
  (``pip install trainhouse[lightning]``).

Each imports the SDK and its framework, never the server side (an import-linter contract).
What they share is :mod:`trainhouse.integrations._common`.
"""

__all__: list[str] = []
