"""trainerd: the Python client of the trainerd training daemon.

Five lines in a notebook::

    import trainerd
    client = trainerd.Client()                     # as trainctl: $TRAINERD_ADDR, contexts, ...
    ds = client.upload("digits", X_train, y_train)  # numpy, torch, pandas, .npy or .csv
    job = client.submit(ds, model="linear:128,relu,linear:10", loss="cross_entropy").wait()
    model = job.model()                             # the trained model, in eval mode

``trainerd.aio.Client`` is the same API on asyncio (grpc.aio).

Everything the daemon refuses raises a :class:`TrainerdError` subclass named after its gRPC code
(:class:`NotFound`, :class:`InvalidArgument`, ...), with the daemon's sentence as the message.
"""

from trainerd._version import __version__
from trainerd.client import Client, Version
from trainerd.config import ClientConfig, ClientContext, Settings, load_config, resolve_settings
from trainerd.datasets import Dataset
from trainerd.errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    ConfigError,
    DataLoss,
    DeadlineExceeded,
    DownloadRefused,
    FailedPrecondition,
    IncompatibleDaemon,
    Internal,
    InvalidArgument,
    JobCancelled,
    JobFailed,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    TrainerdError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)
from trainerd.jobs import Epoch, Job, JobState
from trainerd.sweeps import Sweep

__all__ = [
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "Client",
    "ClientConfig",
    "ClientContext",
    "ConfigError",
    "DataLoss",
    "Dataset",
    "DeadlineExceeded",
    "DownloadRefused",
    "Epoch",
    "FailedPrecondition",
    "IncompatibleDaemon",
    "Internal",
    "InvalidArgument",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobState",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "Settings",
    "Sweep",
    "TrainerdError",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "Version",
    "__version__",
    "load_config",
    "resolve_settings",
]
