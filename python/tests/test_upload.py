"""Client.upload: every kind of input gives the payload trainctl sends for the same data (the
daemon's SHA-256 of it proves it), int64 targets stay int64, bad input is refused before
anything is sent, and a large array streams without a second copy."""

from __future__ import annotations

import hashlib
import resource
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import trainerd
from conftest import Daemon, class_data, run_trainctl, seed_data


def payload_sha256(x: np.ndarray, y: np.ndarray, int64: bool = False) -> str:
    features = np.ascontiguousarray(x, dtype="<f4").tobytes()
    targets = np.ascontiguousarray(y, dtype="<i8" if int64 else "<f4").tobytes()
    return hashlib.sha256(features + targets).hexdigest()


# --- Inputs ----------------------------------------------------------------------------------


def test_numpy_arrays(client: trainerd.Client, name: str) -> None:
    x, y = seed_data(50)
    ds = client.upload(name, x, y)
    assert ds.name == name
    assert ds.rows == 50
    assert ds.feature_shape == (1,)
    assert ds.target_shape == (1,)
    assert ds.target_dtype == "float32"
    assert ds.size_bytes == 50 * 4 * 2
    assert ds.sha256 == payload_sha256(x, y)
    assert ds.device == "cpu"
    assert ds.create_time is not None
    assert ds.last_use_time is not None and ds.last_use_time >= ds.create_time  # no job yet
    assert client.dataset(name) == ds
    assert name in [d.name for d in client.datasets()]
    ds.delete()
    with pytest.raises(trainerd.NotFound):
        client.dataset(name)


def test_int64_targets_stay_int64(client: trainerd.Client, name: str) -> None:
    x, y = class_data(60)
    ds = client.upload(name, x, y)
    assert ds.target_dtype == "int64"
    assert ds.target_shape == ()  # one class index per row
    assert (ds.target_min, ds.target_max) == (0, 2)
    assert ds.sha256 == payload_sha256(x, y, int64=True)
    # Large class indices are kept exactly (float32 would round them).
    big = np.array([2**40 + 1, 3, 2**53 + 1], dtype=np.int64)
    ds2 = client.upload(name + "-big", np.ones((3, 2), np.float32), big)
    assert ds2.target_max == 2**53 + 1


def test_float_targets_as_int64_when_asked(client: trainerd.Client, name: str) -> None:
    x, y = class_data(30)
    ds = client.upload(name, x, y.astype(np.float64), target_dtype="int64")
    assert ds.target_dtype == "int64"
    assert ds.sha256 == payload_sha256(x, y, int64=True)


def test_non_contiguous_and_fortran_arrays(client: trainerd.Client, name: str) -> None:
    rng = np.random.default_rng(0)
    base = rng.random((40, 6))
    fortran = np.asfortranarray(base[:, :4])
    strided = base[::2, ::2]  # 20 x 3, every other row and column
    y = rng.random(40)
    ds = client.upload(name, fortran, y)
    assert ds.sha256 == payload_sha256(fortran, y)
    ds2 = client.upload(name + "-s", strided, y[:20])
    assert ds2.sha256 == payload_sha256(strided, y[:20])
    big_endian = base.astype(">f8")
    ds3 = client.upload(name + "-be", big_endian, y)
    assert ds3.sha256 == payload_sha256(base, y)


def test_targets_in_the_last_columns(client: trainerd.Client, name: str) -> None:
    x, y = seed_data(20)
    table = np.hstack([x, y])
    ds = client.upload(name, table)
    assert ds.sha256 == payload_sha256(x, y)
    both = np.hstack([x, y, y])
    ds2 = client.upload(name + "-2", both, target_columns=2)
    assert ds2.target_shape == (2,)
    assert ds2.sha256 == payload_sha256(x, np.hstack([y, y]))


def test_images_keep_their_shape(client: trainerd.Client, name: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.random((10, 1, 4, 4), dtype=np.float32)
    y = rng.integers(0, 10, 10)
    ds = client.upload(name, x, y)
    assert ds.feature_shape == (1, 4, 4)
    assert ds.sha256 == payload_sha256(x, y, int64=True)


def test_torch_tensors(client: trainerd.Client, name: str) -> None:
    torch = pytest.importorskip("torch")
    x, y = class_data(40)
    ds = client.upload(name, torch.from_numpy(x).requires_grad_(), torch.from_numpy(y))
    assert ds.target_dtype == "int64"
    assert ds.sha256 == payload_sha256(x, y, int64=True)
    # bfloat16, which numpy has no dtype for, and a transposed (non-contiguous) tensor.
    xt = torch.from_numpy(np.ascontiguousarray(x.T)).t()
    ds2 = client.upload(name + "-t", xt, torch.from_numpy(y.astype(np.float32)))
    assert ds2.target_dtype == "float32"
    assert ds2.sha256 == payload_sha256(x, y.astype(np.float32))
    xb = torch.from_numpy(x).to(torch.bfloat16)
    ds3 = client.upload(name + "-bf16", xb, torch.from_numpy(y))
    assert ds3.sha256 == payload_sha256(xb.float().numpy(), y, int64=True)


def test_torch_cuda_tensor(client: trainerd.Client, name: str) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x, y = class_data(40)
    ds = client.upload(name, torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda())
    assert ds.sha256 == payload_sha256(x, y, int64=True)


def test_pandas_dataframe(client: trainerd.Client, name: str) -> None:
    pd = pytest.importorskip("pandas")
    x, y = class_data(30)
    frame = pd.DataFrame({"a": x[:, 0], "label": y, "b": x[:, 1].astype(np.float64)})
    ds = client.upload(name, frame, target="label")
    assert ds.target_dtype == "int64"
    assert ds.feature_shape == (2,)
    assert ds.sha256 == payload_sha256(x, y, int64=True)
    # y as a Series, float targets.
    ds2 = client.upload(name + "-s", frame[["a", "b"]], pd.Series(y.astype(np.float32)))
    assert ds2.target_shape == (1,)
    assert ds2.sha256 == payload_sha256(x, y.astype(np.float32))


def test_npy_files_as_trainctl_sends_them(
    client: trainerd.Client, daemon: Daemon, name: str, tmp_path: Path
) -> None:
    x, y = class_data(80)
    np.save(tmp_path / "x.npy", x.astype(np.float64))
    np.save(tmp_path / "y.npy", y)
    ds = client.upload(name, tmp_path / "x.npy", str(tmp_path / "y.npy"))
    assert ds.target_dtype == "int64"
    ctl = run_trainctl(
        "--addr", daemon.address, "-o", "json", "dataset", "upload", name + "-ctl",
        str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy"),
    )
    assert ctl.returncode == 0, ctl.stderr
    assert client.dataset(name + "-ctl").sha256 == ds.sha256 == payload_sha256(x, y, True)


def test_csv_file_as_trainctl_sends_it(
    client: trainerd.Client, daemon: Daemon, name: str, tmp_path: Path
) -> None:
    x, y = seed_data(70)
    path = tmp_path / "seed.csv"
    lines = ["x,y"] + [f"{a:.9g},{b:.9g}" for a, b in zip(x[:, 0], y[:, 0])]
    path.write_text("\r\n".join(lines) + "\r\n\r\n")
    ds = client.upload(name, path)
    ctl = run_trainctl("--addr", daemon.address, "dataset", "upload", name + "-ctl", str(path))
    assert ctl.returncode == 0, ctl.stderr
    assert client.dataset(name + "-ctl").sha256 == ds.sha256 == payload_sha256(x, y)


def test_progress_callback(client: trainerd.Client, name: str) -> None:
    x = np.zeros((3 * 2**18 + 5, 1), np.float32)  # a little over 3 MiB of features
    seen: list[tuple[int, int]] = []
    ds = client.upload(name, x, x, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (ds.size_bytes, ds.size_bytes)
    assert len(seen) >= 6  # chunks of at most 1 MiB
    assert all(b - a <= 2**20 for (a, _), (b, _) in zip([(0, 0), *seen], seen))


def test_existing_name_is_already_exists(client: trainerd.Client, name: str) -> None:
    x, y = seed_data(5)
    client.upload(name, x, y)
    with pytest.raises(trainerd.AlreadyExists, match=name):
        client.upload(name, x, y)


# --- Refused before anything is sent ---------------------------------------------------------

# A client whose every call would fail with Unavailable: an error of another kind proves that
# nothing was sent.
UNREACHABLE = "127.0.0.1:1"


@pytest.fixture
def offline() -> trainerd.Client:
    return trainerd.Client(UNREACHABLE, timeout=5)


def test_nan_and_inf_rows_are_named(offline: trainerd.Client) -> None:
    x = np.ones((100, 3), np.float32)
    x[7, 2] = np.nan
    x[19, 0] = np.inf
    x[20, 1] = -np.inf
    with pytest.raises(ValueError, match=r"3 rows \(rows 7, 19, 20\).*X\[7, 2\] = .*nan"):
        offline.upload("d", x, np.ones(100, np.float32))
    y = np.ones(100)
    y[42] = np.nan
    with pytest.raises(ValueError, match=r"y has NaN .* \(rows 42\)"):
        offline.upload("d", np.ones((100, 3)), y)


def test_values_beyond_float32_are_refused(offline: trainerd.Client) -> None:
    x = np.ones((4, 2))
    x[2, 1] = 1e300
    with pytest.raises(ValueError, match=r"X\[2, 1\]"):
        offline.upload("d", x, np.ones(4))


def test_object_and_string_dtypes_are_refused(offline: trainerd.Client) -> None:
    with pytest.raises(TypeError, match="object"):
        offline.upload("d", np.array([[1, "a"], [2, "b"]], dtype=object), np.ones(2))
    with pytest.raises(TypeError, match="str"):
        offline.upload("d", np.array([["1"], ["2"]]), np.ones(2))
    with pytest.raises(TypeError, match="complex"):
        offline.upload("d", np.ones((2, 2), np.complex64), np.ones(2))


def test_pandas_non_numeric_columns_are_refused(offline: trainerd.Client) -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": [1.0, 2.0], "name": ["x", "y"], "t": [0, 1]})
    with pytest.raises(TypeError, match="'name'"):
        offline.upload("d", frame, target="t")
    with pytest.raises(ValueError, match="no column 'nope'"):
        offline.upload("d", frame[["a", "t"]], target="nope")
    with pytest.raises(ValueError, match="target="):
        offline.upload("d", frame[["a", "t"]])
    missing = pd.DataFrame({"a": [1.0, None, 3.0], "t": [0, 1, 2]})
    with pytest.raises(ValueError, match=r"rows 1\)"):
        offline.upload("d", missing, target="t")


def test_empty_and_mismatched_arrays_are_refused(offline: trainerd.Client) -> None:
    with pytest.raises(ValueError, match="no rows"):
        offline.upload("d", np.ones((0, 3), np.float32), np.ones(0))
    with pytest.raises(ValueError, match="empty dimension"):
        offline.upload("d", np.ones((5, 0), np.float32), np.ones(5))
    with pytest.raises(ValueError, match="X has 5 rows but y has 4"):
        offline.upload("d", np.ones((5, 2)), np.ones(4))
    with pytest.raises(ValueError, match="2-D"):
        offline.upload("d", np.ones((5, 2, 2)))
    with pytest.raises(ValueError, match="at least 2"):
        offline.upload("d", np.ones((5, 1)))


def test_bad_int64_targets_and_names_are_refused(offline: trainerd.Client) -> None:
    with pytest.raises(ValueError, match=r"y\[1\] = .*2\.5"):
        offline.upload("d", np.ones((3, 1)), np.array([1.0, 2.5, 3.0]), target_dtype="int64")
    with pytest.raises(ValueError, match="target_dtype"):
        offline.upload("d", np.ones((3, 1)), np.ones(3), target_dtype="float16")
    with pytest.raises(ValueError, match="not valid"):
        offline.upload("bad name!", np.ones((3, 1)), np.ones(3))
    with pytest.raises(TypeError, match="numpy array"):
        offline.upload("d", {"a": 1}, np.ones(3))
    with pytest.raises(FileNotFoundError):
        offline.upload("d", "/nonexistent/file.npy")


def test_the_daemon_registers_nothing_for_refused_input(
    client: trainerd.Client, name: str
) -> None:
    x = np.ones((10, 2), np.float32)
    x[3, 0] = np.nan
    with pytest.raises(ValueError):
        client.upload(name, x, np.ones(10))
    with pytest.raises(trainerd.NotFound):
        client.dataset(name)


# --- Memory ------------------------------------------------------------------------------------


def _rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def test_large_upload_streams_without_a_second_copy(client: trainerd.Client, name: str) -> None:
    rows = 200 * 2**20 // (16 * 4)  # 200 MiB of float32 features: rows x 16
    x = np.ones((rows, 16), dtype=np.float32)
    x[::1000] = 0.5
    y = np.zeros(rows, dtype=np.float32)
    x_bytes = x.nbytes
    rss_before = _rss_bytes("VmRSS")
    peak_resettable = True
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        peak_resettable = False
    tracemalloc.start()
    try:
        ds = client.upload(name, x, y, progress=False)
        _, python_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ds.size_bytes == x_bytes + y.nbytes
    assert ds.rows == rows
    # numpy reports its buffers to tracemalloc: a second copy of x would show as 200 MiB here.
    assert python_peak < 32 * 2**20, f"the client allocated {python_peak / 2**20:.0f} MiB"
    if peak_resettable:
        growth = _rss_bytes("VmHWM") - rss_before
        assert growth < x_bytes / 4, f"peak RSS grew {growth / 2**20:.0f} MiB during the upload"
    else:  # pragma: no cover - kernels without clear_refs
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
    ds.delete()


def test_share_refresh_and_progress_bar(
    client: trainerd.Client, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    x, y = seed_data(10)
    ds = client.upload(name, x, y, progress=True)
    assert "upload " + name in capsys.readouterr().err  # tqdm's bar, forced on
    assert ds.shared is False
    assert ds.share().shared is True
    assert client.dataset(name).shared is True
    assert ds.share(False).refresh().shared is False
    assert ds.location in ("device", "disk")
    assert name in repr(ds)


def test_scalars_are_refused(offline: trainerd.Client) -> None:
    with pytest.raises(ValueError, match="y is a scalar"):
        offline.upload("d", np.ones((3, 2)), 1.0)
    with pytest.raises(ValueError, match="X is a scalar"):
        offline.upload("d", 1.0, np.ones(3))


def test_int64_column_targets_keep_their_shape_as_trainctl(
    client: trainerd.Client, name: str
) -> None:
    x, y = class_data(20)
    ds = client.upload(name, x, y.reshape(-1, 1))
    assert (ds.target_dtype, ds.target_shape) == ("int64", (1,))
    assert ds.sha256 == payload_sha256(x, y, int64=True)


# --- What a re-run cell and pandas' files do ---------------------------------------------------


def test_exist_ok_returns_the_same_data_and_sends_nothing(client: trainerd.Client, name: str) -> None:
    x, y = seed_data(40)
    first = client.upload(name, x, y)
    sent: list[tuple[int, int]] = []
    again = client.upload(name, x, y, exist_ok=True, progress=lambda d, t: sent.append((d, t)))
    assert sent == []  # nothing was sent
    assert again == first and again.sha256 == first.sha256
    assert again.create_time == first.create_time
    # Other bytes under the name: still AlreadyExists, saying that they differ.
    other = y.copy()
    other[3] += 1
    with pytest.raises(trainerd.AlreadyExists, match="holds other data than this upload: the "
                       "same shapes but other bytes") as refused:
        client.upload(name, x, other, exist_ok=True)
    assert "overwrite=True" in str(refused.value)
    with pytest.raises(trainerd.AlreadyExists, match="it holds 40 rows, features \\(1,\\), "
                       "targets \\(1,\\) float32; this upload 39 rows"):
        client.upload(name, x[:39], y[:39], exist_ok=True)
    assert client.dataset(name).sha256 == payload_sha256(x, y)
    # A name not taken: an ordinary upload.
    fresh = client.upload(name + "-new", x, y, exist_ok=True)
    assert fresh.sha256 == first.sha256


def test_overwrite_replaces_other_data(client: trainerd.Client, name: str) -> None:
    x, y = seed_data(40)
    first = client.upload(name, x, y)
    x2, y2 = seed_data(25, seed=9)
    replaced = client.upload(name, x2, y2, overwrite=True)
    assert replaced.rows == 25 and replaced.sha256 == payload_sha256(x2, y2)
    assert client.dataset(name).sha256 == replaced.sha256 != first.sha256
    sent: list[tuple[int, int]] = []
    same = client.upload(name, x2, y2, overwrite=True, progress=lambda d, t: sent.append((d, t)))
    assert sent == [] and same.create_time == replaced.create_time  # the same data: kept
    with pytest.raises(ValueError, match="not both"):
        client.upload(name, x, y, exist_ok=True, overwrite=True)
    with pytest.raises(TypeError, match="exist_ok must be True or False"):
        client.upload(name, x, y, exist_ok="yes")  # type: ignore[arg-type]


def test_aio_exist_ok_and_overwrite(daemon: Daemon, name: str) -> None:
    import asyncio

    import trainerd.aio

    x, y = seed_data(30)
    x2, y2 = seed_data(20, seed=4)

    async def main() -> tuple[str, str, str]:
        async with trainerd.aio.Client(daemon.address) as aclient:
            first = await aclient.upload(name, x, y)
            again = await aclient.upload(name, x, y, exist_ok=True)
            with pytest.raises(trainerd.AlreadyExists, match="other data"):
                await aclient.upload(name, x2, y2, exist_ok=True)
            replaced = await aclient.upload(name, x2, y2, overwrite=True)
            return first.sha256, again.sha256, replaced.sha256

    first, again, replaced = asyncio.run(main())
    assert first == again == payload_sha256(x, y)
    assert replaced == payload_sha256(x2, y2)


def wine_frame(rows: int = 60) -> "pandas.DataFrame":
    """A frame shaped like scikit-learn's wine: float features, an integer class column, rows
    sorted by class (so that the row number leaks the label)."""
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(3), rows // 3)
    return pd.DataFrame(
        {
            "alcohol": (12 + labels + 0.3 * rng.standard_normal(rows)).round(3),
            "ash": (2 + 0.2 * rng.standard_normal(rows)).round(3),
            "target": labels.astype(np.int64),
        }
    )


def test_to_csv_index_is_dropped_and_class_column_stays_classes(
    client: trainerd.Client, name: str, tmp_path: Path
) -> None:
    frame = wine_frame()
    path = tmp_path / "wine.csv"
    frame.to_csv(path)  # pandas writes its index by default
    assert path.read_text().startswith(",alcohol,ash,target\n0,")
    with pytest.warns(UserWarning) as caught:
        ds = client.upload(name, str(path))
    messages = [str(w.message) for w in caught]
    assert any("unnamed column" in m and "index=False" in m for m in messages), messages
    assert any("'target' holds whole numbers only (0, 1, 2)" in m and "cross_entropy" in m
               for m in messages), messages
    assert all(w.filename == __file__ for w in caught)  # the warning points at the caller
    x = frame[["alcohol", "ash"]].to_numpy()
    y = frame["target"].to_numpy()
    assert (ds.rows, ds.feature_shape, ds.target_shape, ds.target_dtype) == (60, (2,), (), "int64")
    assert ds.sha256 == payload_sha256(x, y, int64=True)
    # The same frame uploaded as a DataFrame gives the same dataset.
    same = client.upload(name + "-frame", frame, target="target")
    assert same.sha256 == ds.sha256
    # Without a loss, the job trains with cross_entropy, as for int64 labels from numpy.
    job = client.submit(ds, model="linear:3", epochs=1, seed=1).wait(timeout=60)
    assert job.spec.loss == "cross_entropy"

    # index=False: nothing to drop; target_dtype="float32" keeps the values to regress on.
    plain = tmp_path / "plain.csv"
    frame.to_csv(plain, index=False)
    with pytest.warns(UserWarning, match="whole numbers only") as caught:
        client.upload(name + "-plain", str(plain))
    assert not any("unnamed column" in str(w.message) for w in caught)
    import warnings as warnings_module

    with warnings_module.catch_warnings():
        warnings_module.simplefilter("error")
        regress = client.upload(name + "-regress", str(plain), target_dtype="float32")
    assert (regress.target_dtype, regress.target_shape) == ("float32", (1,))
    assert regress.sha256 == payload_sha256(x, y.reshape(-1, 1))


def test_float_and_negative_targets_stay_float32(
    client: trainerd.Client, name: str, tmp_path: Path
) -> None:
    import warnings as warnings_module

    frame = wine_frame()
    frame["target"] = frame["target"].astype(np.float64)  # written as 0.0, 1.0, 2.0
    path = tmp_path / "floats.csv"
    frame.to_csv(path, index=False)
    negative = tmp_path / "negative.csv"
    frame.assign(target=frame["target"].astype(np.int64) - 1).to_csv(negative, index=False)
    # A first column that is not an index (a named one, or values that repeat) is a feature.
    named = tmp_path / "named.csv"
    frame.assign(target=frame["target"] * 0.5).to_csv(named, index_label="row")
    with warnings_module.catch_warnings():
        warnings_module.simplefilter("error")
        floats = client.upload(name, str(path))
        negatives = client.upload(name + "-neg", str(negative))
        kept = client.upload(name + "-named", str(named))
    assert (floats.target_dtype, negatives.target_dtype) == ("float32", "float32")
    assert kept.feature_shape == (3,)  # row, alcohol, ash


def test_dataframe_read_back_with_its_index_column(
    client: trainerd.Client, name: str, tmp_path: Path
) -> None:
    pd = pytest.importorskip("pandas")
    frame = wine_frame()
    path = tmp_path / "wine.csv"
    frame.sample(frac=1.0, random_state=0).to_csv(path)  # a shuffled index
    read = pd.read_csv(path)
    assert list(read.columns) == ["Unnamed: 0", "alcohol", "ash", "target"]
    with pytest.warns(UserWarning, match="first column 'Unnamed: 0'.*index_col=0"):
        ds = client.upload(name, read, target="target")
    assert ds.feature_shape == (2,) and ds.target_dtype == "int64"
    expected = payload_sha256(read[["alcohol", "ash"]].to_numpy(), read["target"].to_numpy(), True)
    assert ds.sha256 == expected
    with pytest.warns(UserWarning, match="Unnamed: 0"):
        ds_y = client.upload(name + "-y", read.drop(columns="target"), read["target"])
    assert ds_y.sha256 == expected
