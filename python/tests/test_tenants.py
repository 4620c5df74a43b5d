"""Dataset names per tenant, through the Python client on a real daemon with three tokens (alice,
bob, and ops an admin): each tenant has its own "digits" and trains on it; another tenant's is
named "OWNER/NAME", NotFound until it is shared; an admin sees every one qualified; a Dataset's
name goes back to the daemon as it came."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import trainerd
from conftest import Daemon, class_data, seed_data

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"
OPS = "ops-token-0123456789abcdef000"


@pytest.fixture(scope="module")
def tenants_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    directory = tmp_path_factory.mktemp("trainerd-tenants")
    tokens = directory / "tokens"
    tokens.write_text(f"alice:{ALICE}\nbob:{BOB}\nops:{OPS} admin\n")
    process = Daemon(directory, [f"--auth_token_file={tokens}"])
    yield process
    process.stop()


def _as(daemon: Daemon, token: str) -> trainerd.Client:
    return trainerd.Client(daemon.address, token=token)


def test_each_tenant_has_its_own_dataset_of_a_name(tenants_daemon: Daemon) -> None:
    alice, bob, ops = (_as(tenants_daemon, t) for t in (ALICE, BOB, OPS))
    x, y = seed_data(40)
    cx, cy = class_data(30)
    mine = alice.upload("digits", x, y)
    theirs = bob.upload("digits", cx, cy)
    assert (mine.name, mine.owner) == ("digits", "alice")
    assert (theirs.name, theirs.owner, theirs.target_dtype) == ("digits", "bob", "int64")
    # Each trains on its own under the same name.
    a = alice.submit("digits", model="linear:1", lr=0.1, batch_size=8, epochs=2, seed=1)
    b = bob.submit("digits", model="linear:3", lr=0.1, batch_size=8, epochs=2, seed=1)
    assert a.wait(timeout=60).state == trainerd.JobState.SUCCEEDED
    assert b.wait(timeout=60).state == trainerd.JobState.SUCCEEDED
    assert a.dataset == b.dataset == "digits"
    assert a.spec.loss != b.spec.loss  # float targets (mse) and classes (cross_entropy)

    # Alice's is bob's only once shared, by its owner's name; until then it does not exist.
    # The NotFound names the datasets bob may use, and nothing of alice's.
    with pytest.raises(trainerd.NotFound) as hidden:
        bob.dataset("alice/digits")
    assert str(hidden.value) == (
        "dataset 'alice/digits' not found (the datasets you can use: digits)"
    )
    with pytest.raises(trainerd.NotFound) as refused:
        bob.submit("alice/digits", model="linear:1", lr=0.1, batch_size=8, epochs=1)
    assert refused.value.details == hidden.value.details
    assert [d.name for d in bob.datasets()] == ["digits"]
    mine.share()
    assert [d.name for d in bob.datasets()] == ["alice/digits", "digits"]
    with pytest.raises(trainerd.NotFound, match=r"the datasets you can use: alice/digits, digits\)$"):
        bob.submit("digitz", model="linear:1")
    shared = bob.dataset("alice/digits")
    assert (shared.name, shared.owner, shared.shared) == ("alice/digits", "alice", True)
    job = bob.submit(shared, model="linear:1", lr=0.1, batch_size=8, epochs=1, seed=2)
    assert job.wait(timeout=60).state == trainerd.JobState.SUCCEEDED
    assert job.dataset == "alice/digits"
    assert [j.dataset for j in bob.jobs(dataset="alice/digits")] == ["alice/digits"]
    assert [j.id for j in bob.jobs(dataset="digits")] == [b.id]

    # An admin names every one with its owner, and its jobs' datasets too.
    assert [d.name for d in ops.datasets()] == ["alice/digits", "bob/digits"]
    assert ops.job(job.id).dataset == "alice/digits"
    assert ops.job(b.id).dataset == "bob/digits"
    assert ops.dataset("bob/digits").sha256 == theirs.sha256

    # An upload is always into the caller's own names.
    with pytest.raises(ValueError, match="bare name"):
        bob.upload("alice/digits", x, y)
    # What bob may not change stays alice's; her own calls go on by the bare name.
    with pytest.raises(trainerd.PermissionDenied, match="belongs to alice"):
        bob.delete_dataset("alice/digits")
    for client in (alice, bob, ops):
        client.close()
