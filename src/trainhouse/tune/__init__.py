"""Hyperparameter searches on Optuna, run inside the server.

A spec with a ``search:`` block (:mod:`trainhouse.core.searchspec`) is a search; each trial is an
ordinary job whose ``hparams`` the sampler chose. :mod:`.study` says where Optuna's study is stored
and builds the sampler and pruner; :mod:`.runner` (``SearchRunner``) is the background loop that
adds trials, feeds reported values to the pruner and reconciles Optuna's trials with trainhouse's
jobs (surviving a killed server); :mod:`.views` is what the API shows.
"""
