"""The request layer without a daemon: every RPC is named once, from the generated services; the
spec leaves the daemon's defaults unset; an operation's steps and the errors thrown back into it,
as both clients' transports run them."""

from __future__ import annotations

from typing import Any

import pytest

from trainerd import _calls, _rpc
from trainerd._rpc import Op, Runner, Unary
from trainerd._connection import Connection
from trainerd._spec import build_spec, given_options
from trainerd.errors import NotFound
from trainerd.v1 import datasets_pb2, jobs_pb2, system_pb2


def test_every_rpc_of_the_services_is_named_once() -> None:
    rpcs = [value for value in vars(_rpc).values() if isinstance(value, _rpc.Rpc)]
    paths = [rpc.path for rpc in rpcs]
    assert len(paths) == len(set(paths))
    methods = {
        f"/{service.full_name}/{method.name}"
        for module in (datasets_pb2, jobs_pb2, system_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert set(paths) == methods
    assert _rpc.SUBMIT_JOB.path == "/trainerd.v1.JobService/SubmitJob"
    assert _rpc.SUBMIT_JOB.response_type is jobs_pb2.Job


def test_the_spec_leaves_the_daemons_defaults_unset() -> None:
    spec = build_spec("seed", "linear:1", {})
    assert spec == jobs_pb2.JobSpec(dataset="seed", model="linear:1")
    # Given values are sent as given, the default's own value too (shuffle=True is explicit).
    given = build_spec("seed", "linear:1", {"shuffle": True, "precision": "fp32", "loss": None})
    assert given.HasField("shuffle") and given.shuffle
    assert given.precision == jobs_pb2.PRECISION_FP32
    assert given.loss == jobs_pb2.LOSS_UNSPECIFIED
    # A signature's defaults are not given: only what differs from them is.
    defaults = {"shuffle": True, "epochs": 10, "loss": None}
    assert given_options({"shuffle": True, "epochs": 10, "loss": None}, defaults) == {}
    assert given_options({"shuffle": False, "epochs": 10.0}, defaults) == {
        "shuffle": False,
        "epochs": 10.0,  # not the default's type: the conversion says so
    }


def run(op: Op[Any], answer: Any) -> Any:
    """Runs ``op`` as a transport does, ``answer(step)`` standing for the daemon."""
    with Runner(op) as runner:
        for step in runner:
            with runner.answer():
                runner.reply(answer(step))
    return runner.result


def test_list_jobs_follows_pages_and_keeps_the_newest() -> None:
    connection = Connection("test:1", 30.0, check_version=False)
    pages = {
        "": (["job-1", "job-2"], "next"),
        "next": (["job-3"], ""),
    }
    asked: list[tuple[int, str, bool]] = []

    def daemon(step: Any) -> Any:
        assert isinstance(step, Unary) and step.rpc is _rpc.LIST_JOBS
        request = step.request
        asked.append((request.page_size, request.page_token, request.newest_first))
        ids, token = pages[request.page_token]
        return jobs_pb2.ListJobsResponse(
            jobs=[jobs_pb2.Job(id=i) for i in ids], next_page_token=token
        )

    assert [j.id for j in run(_calls.jobs(connection), daemon)] == ["job-1", "job-2", "job-3"]
    assert asked == [(1000, "", False), (1000, "next", False)]
    asked.clear()
    # A limit asks newest first and gives the newest, oldest first.
    assert [j.id for j in run(_calls.jobs(connection, limit=2), daemon)] == ["job-2", "job-1"]
    assert asked == [(2, "", True)]


def test_errors_go_back_into_the_operation() -> None:
    connection = Connection("test:1", 30.0, check_version=False)

    def missing(step: Any) -> Any:
        raise NotFound("no members", address="test:1")

    with pytest.raises(NotFound, match="sweep 'sweep-1' not found"):
        run(_calls.get_sweep(connection, "sweep-1"), lambda step: jobs_pb2.ListJobsResponse())
    with pytest.raises(NotFound, match="no members"):
        run(_calls.get_sweep(connection, "sweep-1"), missing)


def test_the_version_is_checked_once_before_the_first_call() -> None:
    connection = Connection("test:1", 30.0, check_version=True)
    asked: list[str] = []

    def daemon(step: Any) -> Any:
        asked.append(step.rpc.path.rsplit("/", 1)[1])
        if step.rpc is _rpc.GET_VERSION:
            return system_pb2.VersionInfo(trainerd_version="0.1.0", libtorch_version="2.11.0")
        return datasets_pb2.ListDatasetsResponse()

    assert run(_calls.datasets(connection), daemon) == []
    assert run(_calls.datasets(connection), daemon) == []
    assert asked == ["GetVersion", "ListDatasets", "ListDatasets"]
    assert run(connection.version(), daemon).libtorch == "2.11.0"
    assert asked == ["GetVersion", "ListDatasets", "ListDatasets"]  # the check's answer
