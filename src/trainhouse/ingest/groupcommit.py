"""Group commit of metric reports: many requests' reports stored in one transaction.

The report use case (:mod:`trainhouse.usecases.reports`) checks a request's body and hands the
parsed :class:`~trainhouse.core.reports.Report`, with the hash of the credential the request
presented, to :meth:`ReportWriter.submit`, which queues it and returns a future. A writer thread
takes everything queued (up to :attr:`ReportWriter.batch_points` points), reads the batch's jobs in
one query and refuses each report whose job does not exist (:class:`NotFound`) or whose credential
is not its job's current one (:class:`Refused`: the route answers it as any refused token, a 401
counted against the client's address), then stores the others, each with
:func:`trainhouse.store.metrics.add`, in ONE transaction, commits, and only then resolves the
futures with what was written and the job as read (for the route's answer: should the job stop?).
An answered request is durable (SQLite's ``synchronous=FULL``, PostgreSQL's commit), and a batch
costs one commit (one fsync) and one credential query however many requests it holds. Nothing waits
to fill a batch: a writer that is idle takes the first report at once, and the reports that arrive
while it commits make the next batch.

A submit may carry ``then``: work done in the same transaction once its points are stored (a
checkpoint's record, :func:`trainhouse.usecases.reports.register`), with the job as read; what
it returns is the answer's :attr:`Stored.then`. The points are durable no later than what it
wrote, and never is what it wrote committed without them. A submit without a report (``None``)
is only its credential checked and its ``then``, in a batch's transaction as any.

Semantics are those of one transaction per report:

* errors stay per request: when storing a report raises (a report past the job's series cap,
  a value the database refuses, a deadlock), the transaction is rolled back and the batch is
  stored again in three parts, in order: the reports before it (one transaction), the failing
  one alone (its own answer, whatever it is), the reports after it (one transaction, split the
  same way if needed). A failed commit, which no report can be blamed for, stores every report
  of the batch in a transaction of its own.
* a batch id stored once per job holds within a batch too (the second copy finds the first's
  row in the same transaction) and across batches;
* a job's reports are stored in the order they were submitted: a job always goes to the same
  writer (``job_id % writers``), each writer takes its queue in order, and a batch is sorted by
  job id stably (a job's reports keep their order; PostgreSQL's row locks are taken in one
  order by every writer).

The queue is bounded (:attr:`ReportWriter.queue_points` points per writer, a report bigger
than that only into an empty queue): past it, :meth:`ReportWriter.submit` raises
:class:`~trainhouse.core.errors.ServerBusy` (503 with ``Retry-After``; the SDK retries a 5xx with
the same batch id). :meth:`ReportWriter.stop` refuses new reports, stores everything queued,
then ends the threads.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from trainhouse.core.errors import NotFound, Refused, ServerBusy
from trainhouse.core.records import Job
from trainhouse.core.reports import Report
from trainhouse.store import metrics

if TYPE_CHECKING:
    from trainhouse.store.store import Store

__all__ = ["Refused", "ReportWriter", "Stored"]

log = logging.getLogger(__name__)

#: points a writer queues at most (a bigger report only into an empty queue): about 200 bytes
#: each as parsed columns, so ~100 MB per writer
QUEUE_POINTS = 500_000
#: points a batch takes at most (a bigger report makes a batch of its own)
BATCH_POINTS = 50_000
RETRY_AFTER = 1.0  # seconds, in the 503's Retry-After


@dataclass(frozen=True)
class Stored:
    """A report committed: the points written (0 for a batch id seen before), its job as
    read before the write, and what the submit's ``then`` returned in its transaction (None
    without one)."""

    accepted: int
    job: Job
    then: Any = None


#: work done in a report's transaction after its points: (the connection, its job) -> answer
Then = Callable[[Connection, Job], Any]


@dataclass
class _Pending:
    job_id: int
    report: Report | None  # None: no points, only ``then``
    credential: str  # the hash of the token the request presented
    then: Then | None = None
    future: Future[Stored] = field(default_factory=Future)
    job: Job | None = None  # read by the writer

    @property
    def points(self) -> int:
        return 0 if self.report is None else len(self.report.columns)


class _Failed(Exception):
    """Storing a batch failed at report ``index`` (None: at the commit)."""

    def __init__(self, index: int | None, cause: BaseException) -> None:
        super().__init__(index, cause)
        self.index = index
        self.cause = cause


class _Lane:
    """One writer: its queue and its thread."""

    def __init__(self, writer: ReportWriter, number: int) -> None:
        self.writer = writer
        self.queue: deque[_Pending] = deque()
        self.points = 0  # queued
        self.cond = threading.Condition()
        self.thread = threading.Thread(
            target=self.run, name=f"trainhouse-report-writer-{number}", daemon=True
        )

    def put(self, item: _Pending) -> None:
        with self.cond:
            if self.writer.stopping:
                raise ServerBusy("the server is shutting down; retry", retry_after=RETRY_AFTER)
            if self.queue and self.points + item.points > self.writer.queue_points:
                raise ServerBusy(
                    f"the server has {self.points:,} metric points queued for storing, the most "
                    "it holds; retry",
                    retry_after=RETRY_AFTER,
                )
            self.queue.append(item)
            self.points += item.points
            self.cond.notify()

    def take(self) -> list[_Pending] | None:
        """The next batch (None: stopped and nothing left)."""
        with self.cond:
            while not self.queue:
                if self.writer.stopping:
                    return None
                self.cond.wait()
            batch = [self.queue.popleft()]
            points = batch[0].points
            limit = self.writer.batch_points
            while self.queue and points + self.queue[0].points <= limit:
                item = self.queue.popleft()
                batch.append(item)
                points += item.points
            self.points -= points
        # a future cancelled while queued (its request gone) is not stored
        return [p for p in batch if p.future.set_running_or_notify_cancel()]

    def run(self) -> None:
        while (batch := self.take()) is not None:
            if batch:
                batch.sort(key=lambda p: p.job_id)  # stable: a job's reports keep their order
                try:
                    self.writer.store(batch)
                except BaseException as exc:  # never leave a request waiting
                    log.exception("the report writer failed")
                    for p in batch:
                        if not p.future.done():
                            p.future.set_exception(exc)


class ReportWriter:
    """Stores submitted reports in group commits (see the module's docstring)."""

    def __init__(
        self,
        db: Store,
        *,
        writers: int = 1,
        queue_points: int = QUEUE_POINTS,
        batch_points: int = BATCH_POINTS,
    ) -> None:
        self.db = db
        self.queue_points = queue_points
        self.batch_points = batch_points
        self.stopping = False
        self.transactions = 0  # committed, for tests and the curious
        self._lanes = [_Lane(self, i) for i in range(max(1, writers))]
        self._started = False
        #: called with each batch before it is stored (tests hold a writer back with it)
        self.before_batch: Callable[[int], None] | None = None

    @property
    def writers(self) -> int:
        return len(self._lanes)

    def start(self) -> None:
        if not self._started:
            self._started = True
            for lane in self._lanes:
                lane.thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Refuse new reports, store the queued ones, end the threads."""
        for lane in self._lanes:
            with lane.cond:
                self.stopping = True
                lane.cond.notify_all()
        if self._started:
            for lane in self._lanes:
                lane.thread.join(timeout)

    def queued(self) -> int:
        """Reports waiting to be stored."""
        return sum(len(lane.queue) for lane in self._lanes)

    def submit(
        self, job_id: int, report: Report | None, credential: str, *, then: Then | None = None
    ) -> Future[Stored]:
        """Queue ``report`` (checked; None: no points) for ``job_id``, sent with the token whose
        hash is ``credential``, and ``then``, called in the same transaction after the points
        are stored; the future gives :class:`Stored` once the points are committed, or raises
        :class:`NotFound`, :class:`Refused` or the error storing them (or ``then``) raised,
        nothing of the report committed. Raises :class:`~trainhouse.core.errors.ServerBusy`
        when the queue is full or the writer stopping."""
        if not self._started:
            raise ServerBusy("the report writer is not running", retry_after=RETRY_AFTER)
        item = _Pending(job_id, report, credential, then)
        self._lanes[job_id % len(self._lanes)].put(item)
        return item.future

    # -- storing ---------------------------------------------------------------------------
    def _admit(self, batch: Sequence[_Pending]) -> list[bool]:
        """Whether each report of ``batch`` may be stored: its job exists and its credential is
        the job's current one (read in one query, in the storing transaction, the rows locked
        until it ends: an attempt that ends meanwhile cannot have a report of its stored after
        its end). The others' futures get :class:`NotFound` or :class:`Refused`."""
        jobs = self.db.jobs.get_many((p.job_id for p in batch), lock=True)
        admitted = []
        for p in batch:
            job = jobs.get(p.job_id)
            if job is None:
                p.future.set_exception(NotFound(f"job {p.job_id} does not exist"))
            elif job.token_hash is None or not hmac.compare_digest(p.credential, job.token_hash):
                p.future.set_exception(Refused(job))
            else:
                p.job = job
            admitted.append(p.job is not None and not p.future.done())
        return admitted

    def store(self, batch: Sequence[_Pending]) -> None:
        """Store ``batch`` in one transaction, else in parts (errors stay per report)."""
        batch = [p for p in batch if not p.future.done()]  # a part's refused ones: answered
        if not batch:
            return
        if self.before_batch is not None:
            self.before_batch(len(batch))
        try:
            results = self._transaction(batch)
        except _Failed as failed:
            if len(batch) == 1:
                batch[0].future.set_exception(failed.cause)
            elif failed.index is None:  # the commit failed: every report on its own
                for p in batch:
                    self.store([p])
            else:
                i = failed.index
                if i:
                    self.store(batch[:i])
                self.store(batch[i : i + 1])
                if i + 1 < len(batch):
                    self.store(batch[i + 1 :])
            return
        for p, done in zip(batch, results, strict=True):
            if done is not None:  # None: refused, answered already
                assert p.job is not None
                accepted, then = done
                p.future.set_result(Stored(accepted, p.job, then))

    def _transaction(self, batch: Sequence[_Pending]) -> list[tuple[int, Any] | None]:
        results: list[tuple[int, Any] | None] = []
        dialect = self.db.dialect
        index: int | None = None
        try:
            with self.db.transaction() as conn:
                admitted = self._admit(batch)
                for index, p in enumerate(batch):
                    if not admitted[index]:
                        results.append(None)
                        continue
                    r = p.report
                    accepted = 0
                    if r is not None:
                        resume = (r.attempt, r.resume_step) if r.resume_step is not None else None
                        accepted = metrics.add(
                            conn,
                            dialect,
                            p.job_id,
                            r.columns,
                            batch_id=r.batch_id,
                            total_steps=r.total_steps,
                            resume=resume,
                        )
                    assert p.job is not None
                    then = p.then(conn, p.job) if p.then is not None else None
                    results.append((accepted, then))
                index = None  # from here on: the commit
        except Exception as exc:
            raise _Failed(index, exc) from exc
        self.transactions += 1
        return results
