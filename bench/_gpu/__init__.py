"""The steps of ``bench/gpu_check.py``, one module each, run as ``python -m _gpu.STEP`` with
``bench/`` on ``PYTHONPATH``; :mod:`_gpu.common` is what they share."""
