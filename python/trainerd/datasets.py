"""Datasets resident in the daemon: what :meth:`trainerd.Client.upload`,
:meth:`~trainerd.Client.dataset` and :meth:`~trainerd.Client.datasets` return."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Union

from trainerd.v1 import datasets_pb2

if TYPE_CHECKING:
    from trainerd.client import Client

__all__ = ["Dataset", "DatasetBase"]

_DTYPES = {
    datasets_pb2.DTYPE_FLOAT32: "float32",
    datasets_pb2.DTYPE_INT64: "int64",
}
_LOCATIONS = {
    datasets_pb2.DATASET_LOCATION_DEVICE: "device",
    datasets_pb2.DATASET_LOCATION_HOST: "host",
    datasets_pb2.DATASET_LOCATION_DISK: "disk",
}


class DatasetBase:
    """What every dataset object has: the figures of the daemon's answer (trainerd.v1.Dataset).
    :class:`Dataset` (and ``trainerd.aio.Dataset``) add the calls."""

    def __init__(self, proto: datasets_pb2.Dataset) -> None:
        self._proto = proto

    @property
    def proto(self) -> datasets_pb2.Dataset:
        """The daemon's message (trainerd.v1.Dataset), for fields this class does not name."""
        return self._proto

    @property
    def name(self) -> str:
        """The name to give every call: the bare name for one of the caller's datasets,
        ``"OWNER/NAME"`` for another owner's (one shared with the caller, or any for an admin).
        Names are per owner: two tenants may each have a ``"digits"``."""
        return self._proto.name

    @property
    def rows(self) -> int:
        return self._proto.row_count

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Per-row feature shape, e.g. (1, 28, 28). Features are float32."""
        return tuple(self._proto.feature_shape)

    @property
    def target_shape(self) -> tuple[int, ...]:
        """Per-row target shape; () for one scalar (an int64 class index) per row."""
        return tuple(self._proto.target_shape)

    @property
    def target_dtype(self) -> str:
        """"float32" or "int64"."""
        return _DTYPES.get(self._proto.target_dtype, "unspecified")

    @property
    def size_bytes(self) -> int:
        """Payload bytes: features plus targets."""
        return self._proto.size_bytes

    @property
    def sha256(self) -> str:
        return self._proto.sha256

    @property
    def device(self) -> str:
        return self._proto.device

    @property
    def location(self) -> str:
        """"device", "host" or "disk": where its tensors are now."""
        return _LOCATIONS.get(self._proto.location, "unspecified")

    @property
    def create_time(self) -> datetime.datetime | None:
        if not self._proto.HasField("create_time"):
            return None
        return self._proto.create_time.ToDatetime(tzinfo=datetime.timezone.utc)

    @property
    def last_use_time(self) -> datetime.datetime | None:
        """When a job last took it (its upload time when none has)."""
        if not self._proto.HasField("last_use_time"):
            return None
        return self._proto.last_use_time.ToDatetime(tzinfo=datetime.timezone.utc)

    @property
    def target_min(self) -> int:
        """For int64 targets: the smallest class index (0 for float32 targets)."""
        return self._proto.target_min

    @property
    def target_max(self) -> int:
        """For int64 targets: the largest class index (0 for float32 targets)."""
        return self._proto.target_max

    @property
    def owner(self) -> str:
        return self._proto.owner

    @property
    def shared(self) -> bool:
        return self._proto.shared

    @property
    def peer_copy(self) -> bool:
        """A copy another daemon sent for the ranks or sweep members of a job submitted there
        (with ``nodes``); the daemon deletes it once no job has used it for its
        ``--peer_copy_retention``."""
        return self._proto.peer_copy

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, rows={self.rows}, feature_shape={self.feature_shape}, "
            f"target_shape={self.target_shape}, target_dtype={self.target_dtype!r}, "
            f"size_bytes={self.size_bytes}, device={self.device!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatasetBase) and other._proto == self._proto

    def __hash__(self) -> int:
        return hash((self.name, self.sha256))


#: A dataset as the calls take it: its name, or an object of either client.
DatasetRef = Union[str, DatasetBase]


def dataset_name(dataset: DatasetRef) -> str:
    return dataset.name if isinstance(dataset, DatasetBase) else dataset


class Dataset(DatasetBase):
    """A dataset the daemon holds: its figures as the daemon reported them when this object was
    made (:meth:`refresh` asks again).

    Example::

        ds = client.upload("houses", X, y)
        print(ds.rows, ds.feature_shape, ds.target_dtype, ds.size_bytes)
        ds.delete()
    """

    def __init__(self, client: Client, proto: datasets_pb2.Dataset) -> None:
        super().__init__(proto)
        self._client = client

    def refresh(self) -> Dataset:
        """Asks the daemon again (GetDataset); returns self."""
        self._proto = self._client.dataset(self.name).proto
        return self

    def delete(self) -> None:
        """Deletes the dataset (DeleteDataset). FailedPrecondition while a queued or running job
        uses it."""
        self._client.delete_dataset(self.name)

    def share(self, shared: bool = True) -> Dataset:
        """Lets other tenants' jobs train on it (or stops it); returns self."""
        self._proto = self._client.share_dataset(self.name, shared).proto
        return self
