"""The request layer: every call of the client's API, once for both clients.

Each operation builds its request, makes the call through the client's
:class:`~trainerd._connection.Connection` (so that the daemon's version is checked on the first
one) and turns the response into what the call returns. Operations are generators of steps
(:mod:`trainerd._rpc`): the synchronous client runs them on its transport, the asyncio client
awaits them, and both wrap the messages returned in their own :class:`~trainerd.Job`,
:class:`~trainerd.Dataset` and :class:`~trainerd.Sweep` objects. The requests of submit and
sweep are built in :mod:`trainerd._submit`, an upload's in :mod:`trainerd._upload`, the
downloads' in :mod:`trainerd._download`, the health check's in :mod:`trainerd._health`.

The checks here are those the client needs to write a request: a state name that is no job
state, a limit that is no count, an empty sweep id (which the request would carry as "any
sweep"). The form of a sweep id is the daemon's to check.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainerd._connection import Connection
from trainerd._display import JobDisplay, SweepDisplay
from trainerd._jobbase import EpochFeed, JobBase, JobState
from trainerd._rpc import (
    CANCEL_JOB,
    DELETE_DATASET,
    DELETE_JOB,
    DIAGNOSE,
    GET_DATASET,
    GET_JOB,
    LIST_DATASETS,
    LIST_DEVICES,
    LIST_JOBS,
    SHARE_DATASET,
    WATCH_JOB,
    Drain,
    Many,
    Op,
    Stream,
    Unary,
)
from trainerd.datasets import DatasetRef, dataset_name
from trainerd.errors import DeadlineExceeded, NotFound, TrainerdError
from trainerd.v1 import datasets_pb2, jobs_pb2, system_pb2

if TYPE_CHECKING:
    from trainerd.sweeps import SweepBase

#: Diagnose measures every device on first use: a longer default deadline.
DIAGNOSE_TIMEOUT = 120.0
#: The daemon's largest ListJobs page.
LIST_PAGE = 1000
#: While a sweep's progress is shown, how often its members are asked again (as `trainctl sweep
#: --watch` redraws its table): often enough to follow the epochs, seldom enough that a 256-member
#: sweep costs the daemon little. The end of the member waited on is seen at once.
POLL_SECONDS = 0.4

# --- System --------------------------------------------------------------------------------------


def devices(connection: Connection) -> Op[list[system_pb2.DeviceStatus]]:
    response = yield from connection.call(Unary(LIST_DEVICES, system_pb2.ListDevicesRequest()))
    return list(response.devices)


def diagnose(
    connection: Connection, refresh: bool, timeout: float | None
) -> Op[system_pb2.DiagnoseResponse]:
    deadline = timeout if timeout is not None else max(DIAGNOSE_TIMEOUT, connection.timeout)
    request = system_pb2.DiagnoseRequest(refresh=refresh)
    return (yield from connection.call(Unary(DIAGNOSE, request, deadline)))


# --- Datasets ------------------------------------------------------------------------------------


def datasets(connection: Connection) -> Op[list[datasets_pb2.Dataset]]:
    response = yield from connection.call(Unary(LIST_DATASETS, datasets_pb2.ListDatasetsRequest()))
    return list(response.datasets)


def dataset(connection: Connection, name: DatasetRef) -> Op[datasets_pb2.Dataset]:
    request = datasets_pb2.GetDatasetRequest(name=dataset_name(name))
    return (yield from connection.call(Unary(GET_DATASET, request)))


def delete_dataset(connection: Connection, name: DatasetRef) -> Op[None]:
    request = datasets_pb2.DeleteDatasetRequest(name=dataset_name(name))
    yield from connection.call(Unary(DELETE_DATASET, request))


def share_dataset(
    connection: Connection, name: DatasetRef, shared: bool
) -> Op[datasets_pb2.Dataset]:
    request = datasets_pb2.ShareDatasetRequest(name=dataset_name(name), shared=shared)
    return (yield from connection.call(Unary(SHARE_DATASET, request)))


# --- Jobs ----------------------------------------------------------------------------------------


def _get_job(job_id: str) -> Unary[jobs_pb2.Job]:
    return Unary(GET_JOB, jobs_pb2.GetJobRequest(id=job_id))


def job(connection: Connection, job_id: str) -> Op[jobs_pb2.Job]:
    """GetJob: every field of the job."""
    return (yield from connection.call(_get_job(job_id)))


def refresh(connection: Connection, target: JobBase) -> Op[None]:
    """Asks the daemon for ``target`` again (GetJob) and keeps the answer in it."""
    target._proto = yield from job(connection, target.id)  # noqa: SLF001


def refresh_all(connection: Connection, targets: Sequence[JobBase]) -> Op[None]:
    """:func:`refresh` of every job of ``targets``, asked together."""
    if not targets:
        return
    yield from connection.ready()
    protos = yield Many(tuple(_get_job(target.id) for target in targets))
    for target, proto in zip(targets, protos):
        target._proto = proto  # noqa: SLF001


def cancel_job(connection: Connection, job_id: str) -> Op[jobs_pb2.Job]:
    return (yield from connection.call(Unary(CANCEL_JOB, jobs_pb2.CancelJobRequest(id=job_id))))


def delete_job(connection: Connection, job_id: str) -> Op[None]:
    yield from connection.call(Unary(DELETE_JOB, jobs_pb2.DeleteJobRequest(id=job_id)))


def _list_jobs_request(
    state: str | JobState | None,
    dataset: DatasetRef | None,
    limit: int | None,
    sweep: str | None,
) -> jobs_pb2.ListJobsRequest:
    """The first page's request of :func:`jobs` (page_size is set per page)."""
    request = jobs_pb2.ListJobsRequest()
    if sweep is not None:
        if not isinstance(sweep, str) or not sweep:
            raise ValueError(
                f"sweep must be a sweep's id such as 'sweep-0123456789ab', got {sweep!r}"
            )
        request.sweep_id = sweep
    if state is not None:
        try:
            parsed = JobState(str(state).upper().replace("CANCELED", "CANCELLED"))
        except ValueError:
            raise ValueError(
                f"state must be queued, running, succeeded, failed or cancelled, not {state!r}"
            ) from None
        request.state = parsed.to_proto()  # type: ignore[assignment]
    if dataset is not None:
        request.dataset = dataset_name(dataset)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a whole number >= 1, got {limit!r}")
        request.newest_first = True
    return request


def jobs(
    connection: Connection,
    state: str | JobState | None = None,
    dataset: DatasetRef | None = None,
    limit: int | None = None,
    sweep: str | None = None,
) -> Op[list[jobs_pb2.Job]]:
    """The jobs the caller may see, oldest first, following the daemon's pages (ListJobs, basic
    view); with ``limit``, the newest ``limit`` (asked newest first)."""
    request = _list_jobs_request(state, dataset, limit, sweep)
    found: list[jobs_pb2.Job] = []
    while True:
        request.page_size = LIST_PAGE if limit is None else min(LIST_PAGE, limit - len(found))
        page = yield from connection.call(Unary(LIST_JOBS, request))
        found.extend(page.jobs)
        if not page.next_page_token or (limit is not None and len(found) >= limit):
            break
        request.page_token = page.next_page_token
    return found if limit is None else list(reversed(found[:limit]))


def get_sweep(connection: Connection, sweep_id: str) -> Op[list[jobs_pb2.Job]]:
    """The members of sweep ``sweep_id``, in order; NotFound when the daemon knows none."""
    members = yield from jobs(connection, sweep=sweep_id)
    if not members:
        raise NotFound(f"sweep {sweep_id!r} not found", address=connection.address)
    return members


def watch(job_id: str, timeout: float | None) -> Stream[jobs_pb2.JobEvent]:
    """WatchJob's stream of job ``job_id``: its epochs so far, each new one, then its end."""
    return Stream(WATCH_JOB, jobs_pb2.WatchJobRequest(id=job_id), timeout)


def follow(
    connection: Connection, job_id: str, timeout: float | None, display: JobDisplay | None
) -> Op[jobs_pb2.Job | None]:
    """Follows job ``job_id`` on a WatchJob stream until it ends, handing each epoch to
    ``display``: the terminal Job event, or None when the stream ended without one.
    DeadlineExceeded when ``timeout`` passes first."""
    yield from connection.ready()
    feed = EpochFeed(display)
    ended: list[jobs_pb2.Job] = []

    def take(event: jobs_pb2.JobEvent) -> bool:
        feed.take(event)
        if feed.ended:
            ended.append(event.job)
        return feed.ended

    yield Drain(watch(job_id, timeout), take)
    return ended[0] if ended else None


def wait(
    connection: Connection, target: JobBase, timeout: float | None, display: JobDisplay | None
) -> Op[None]:
    """Follows ``target`` until it ends (the end is seen the moment the daemon publishes it),
    then asks for it again. TimeoutError when ``timeout`` seconds pass first (the job goes on).
    ``display`` is closed at the end."""
    start = time.monotonic()
    try:
        ended = yield from follow(connection, target.id, timeout, display)
    except DeadlineExceeded:
        raise TimeoutError(
            f"job '{target.id}' did not end within {timeout:g} s (it goes on)"
        ) from None
    finally:
        if display is not None:
            display.close()
    yield from refresh(connection, target)
    if ended is None and not target.cached_state.ended:
        if timeout is not None and time.monotonic() - start >= timeout:
            raise TimeoutError(f"job '{target.id}' did not end within {timeout:g} s")
        raise TrainerdError(f"the watch of job '{target.id}' ended before the job did")


# --- Sweeps --------------------------------------------------------------------------------------


def _timed_out(sweep: SweepBase[Any], timeout: float | None) -> TimeoutError:
    return TimeoutError(f"sweep '{sweep.id}' did not end within {timeout:g} s")


def wait_sweep(
    connection: Connection,
    sweep: SweepBase[Any],
    timeout: float | None,
    display: SweepDisplay | None,
) -> Op[None]:
    """Waits until every member of ``sweep`` ended, leaving them current (members that train as
    one pack end together); a member that failed does not raise. TimeoutError when ``timeout``
    seconds pass first. With ``display``, every member still running is asked again every
    POLL_SECONDS and shown (as trainctl's sweep --watch); ``display`` is closed at the end."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if display is not None:
        try:
            yield from _follow_sweep(connection, sweep, deadline, timeout, display)
        finally:
            display.close()
        return
    for member in sweep.jobs:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if left == 0.0:
            if member._needs_full():  # noqa: SLF001
                yield from refresh(connection, member)
            if not member.cached_state.ended:
                raise _timed_out(sweep, timeout)
            continue
        try:
            yield from wait(connection, member, left, None)
        except TimeoutError:
            raise _timed_out(sweep, timeout) from None


def _follow_sweep(
    connection: Connection,
    sweep: SweepBase[Any],
    deadline: float | None,
    timeout: float | None,
    display: SweepDisplay,
) -> Op[None]:
    """Asks the daemon about every member still running, shows them, and waits (at most
    POLL_SECONDS, less when the deadline is nearer) on the first of them, until every member
    ended."""
    while True:
        yield from refresh_all(
            connection, [member for member in sweep.jobs if member._needs_full()]  # noqa: SLF001
        )
        display.update(sweep.jobs)
        running = [member for member in sweep.jobs if not member.cached_state.ended]
        if not running:
            return
        wait_for = POLL_SECONDS
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _timed_out(sweep, timeout)
            wait_for = min(POLL_SECONDS, left)
        try:
            yield from follow(connection, running[0].id, wait_for, None)
        except DeadlineExceeded:
            pass
