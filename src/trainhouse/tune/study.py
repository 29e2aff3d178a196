"""Optuna's side of a search: where its study is stored, and the sampler and pruner a search's
spec names.

Optuna is an optional extra (``pip install trainhouse[tune]``): it is imported here, lazily, and
:func:`available` says whether a search can be submitted at all.

Where the studies live (:func:`optuna_storage`), in the server's own database but never in
trainhouse's tables, so that neither side's migrations meet the other's tables:

* PostgreSQL: the same database, in a schema of its own (``optuna``; its tables and its own
  ``alembic_version`` go there through the connection's ``search_path``). trainhouse's
  migrations and schema checks look at the default schema only.
* SQLite: a file of its own beside the server's (``trainhouse.db`` -> ``trainhouse.optuna.db``):
  SQLite has one writer per file, so Optuna's writes never queue behind the metric group commits,
  and Optuna's ``alembic_version`` table cannot collide with trainhouse's.

Samplers are made afresh for each ``ask`` with a seed derived from the search's seed and the
trial's number (:func:`sampler`): what a trial samples depends on the seed and the study's
stored history only, never on a random state held in memory, so a restarted server goes on
sampling exactly as the old one would have.
"""

from __future__ import annotations

import importlib.util
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

from trainhouse.core.errors import SpecError
from trainhouse.core.searchspec import Distribution, SearchSpec

if TYPE_CHECKING:
    import optuna

__all__ = [
    "OPTUNA_SCHEMA",
    "available",
    "optuna_storage",
    "pruner",
    "sampler",
    "suggest",
    "to_optuna",
]

OPTUNA_SCHEMA = "optuna"
_lock = threading.Lock()


def available() -> bool:
    """Whether Optuna is installed (the ``tune`` extra)."""
    return importlib.util.find_spec("optuna") is not None


def require() -> None:
    if not available():
        raise SpecError(
            "this server cannot run searches: Optuna is not installed "
            "(pip install 'trainhouse[tune]' on the server's machine)"
        )


def storage_location(db_url: str, home: Path) -> tuple[str, dict[str, Any]]:
    """Optuna's URL and engine options for a server on ``db_url``."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        database = url.database
        if not database or database == ":memory:":
            path = home / "optuna.db"
        else:
            own = Path(database)
            path = own.with_name(f"{own.stem}.optuna.db")
        return f"sqlite:///{path}", {"connect_args": {"timeout": 60}}
    return db_url, {
        "connect_args": {"options": f"-csearch_path={OPTUNA_SCHEMA}"},
        "pool_pre_ping": True,
    }


def _prepare(url: str) -> None:
    """The schema on PostgreSQL; WAL (readers never wait for the writer) on SQLite."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}"))
            elif engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    finally:
        engine.dispose()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """Optuna's file: WAL, and NORMAL synchronisation (a commit survives the server's crash,
    not a power loss; a trial's end that a lost write takes back, the runner tells again from
    its row, which trainhouse's own database keeps with FULL: ``SearchRunner._mend``). A
    pruning decision writes a few times: an fsync each would cost more than the decision."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=60000")
    cur.close()


def optuna_storage(db_url: str, home: Path) -> optuna.storages.BaseStorage:
    """Optuna's RDBStorage for this server's database (made once per server)."""
    require()
    import optuna

    url, options = storage_location(db_url, home)
    with _lock:
        _prepare(url)
        rdb = optuna.storages.RDBStorage(url, engine_kwargs=options)
        if rdb.engine.dialect.name == "sqlite":
            event.listen(rdb.engine, "connect", _sqlite_pragmas)
            rdb.engine.dispose()  # the connections made so far go: the next ones get them
    # the cache Optuna puts in front of its database (finished trials read once)
    return optuna.storages.get_storage(rdb)


def to_optuna(dist: Distribution) -> optuna.distributions.BaseDistribution:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if dist.kind == "choice":
        return CategoricalDistribution(dist.args)
    if dist.kind == "int":
        return IntDistribution(dist.args[0], dist.args[1])
    return FloatDistribution(dist.args[0], dist.args[1], log=dist.kind == "log_uniform")


def suggest(trial: optuna.trial.Trial, name: str, dist: Distribution) -> Any:
    """The trial's value of ``name`` (sampled now, or the one it has)."""
    if dist.kind == "choice":
        return trial.suggest_categorical(name, dist.args)
    if dist.kind == "int":
        return trial.suggest_int(name, dist.args[0], dist.args[1])
    return trial.suggest_float(name, dist.args[0], dist.args[1], log=dist.kind == "log_uniform")


def _derived(seed: int | None, number: int) -> int | None:
    return None if seed is None else (seed * 1_000_003 + number * 7919 + 17) % 2**32


def sampler(
    search: SearchSpec, space: dict[str, Distribution], number: int
) -> optuna.samplers.BaseSampler:
    """The sampler that picks trial ``number``'s values."""
    import optuna

    method = search.method
    if method == "grid":  # its order over the grid is a shuffle by the seed: the search's own
        grid = {name: dist.grid() or [] for name, dist in space.items()}
        return optuna.samplers.GridSampler(grid, seed=search.seed)
    if method == "random":
        return optuna.samplers.RandomSampler(seed=_derived(search.seed, number))
    if method == "qmc":  # one sequence for the whole study: the search's own seed
        with warnings.catch_warnings():  # "experimental" since Optuna 3.0: known, chosen
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(seed=search.seed, warn_independent_sampling=False)
    if method == "cmaes":
        return optuna.samplers.CmaEsSampler(
            seed=_derived(search.seed, number), warn_independent_sampling=False
        )
    return optuna.samplers.TPESampler(seed=_derived(search.seed, number))


def neutral_sampler() -> optuna.samplers.BaseSampler:
    """A sampler to tell Optuna a trial's end with: the grid sampler's ``after_trial`` stops
    the study (``Study.stop``, for ``optimize``) once the grid is used up, which only an
    objective function may call."""
    import optuna

    return optuna.samplers.RandomSampler(seed=0)


def pruner(search: SearchSpec) -> optuna.pruners.BasePruner:
    import optuna

    stop = search.early_stopping
    if stop.method == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=stop.min_steps, reduction_factor=stop.reduction_factor
        )
    if stop.method == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=stop.min_steps,
            max_resource=stop.max_steps if stop.max_steps is not None else "auto",
            reduction_factor=stop.reduction_factor,
        )
    if stop.method == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=min(5, max(1, search.max_concurrent)), n_warmup_steps=stop.min_steps
        )
    return optuna.pruners.NopPruner()
