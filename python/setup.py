"""Builds the trainerd package: the gRPC and protobuf modules are generated from the .proto files
while the package is built (build_py), into the build tree, and never committed.

Where the .proto files are: $TRAINERD_PROTO_DIR, else ../proto (this repository's), else proto/
beside this file (where an sdist keeps its copy).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
MYPY_HEADER = "# mypy: ignore-errors\n"
PROTO_FILES = ["trainerd/v1/datasets.proto", "trainerd/v1/jobs.proto", "trainerd/v1/system.proto"]


def proto_dir() -> Path:
    """The folder that holds trainerd/v1/*.proto."""
    candidates = []
    if os.environ.get("TRAINERD_PROTO_DIR"):
        candidates.append(Path(os.environ["TRAINERD_PROTO_DIR"]))
    candidates += [HERE.parent / "proto", HERE / "proto"]
    for candidate in candidates:
        if all((candidate / name).is_file() for name in PROTO_FILES):
            return candidate.resolve()
    raise SystemExit(
        "trainerd: cannot find trainerd/v1/{datasets,jobs,system}.proto in "
        + ", ".join(str(c) for c in candidates)
        + " (set TRAINERD_PROTO_DIR to the folder that holds trainerd/v1/)"
    )


def generate(out_dir: Path) -> None:
    """Runs grpc_tools.protoc: trainerd/v1/*_pb2.py, *_pb2.pyi and *_pb2_grpc.py under out_dir."""
    import grpc_tools  # noqa: PLC0415 (a build requirement, imported when building only)

    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    source = proto_dir()
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{source}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTO_FILES,
    ]
    result = subprocess.run(command, cwd=source, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"trainerd: protoc failed:\n{result.stdout}{result.stderr}")
    # Generated code is not held to the package's type checks (mypy --strict): its types are
    # used, its errors not reported.
    for path in sorted((out_dir / "trainerd" / "v1").glob("*_pb2*.py*")):
        text = path.read_text()
        if not text.startswith(MYPY_HEADER):
            path.write_text(MYPY_HEADER + text)


def protobuf_requirement() -> str:
    """protobuf at least as new as the generated code (its runtime refuses older), below the next
    major version. Read from the header protoc writes into a generated module."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            text = (Path(tmp) / "trainerd/v1/system_pb2.py").read_text()
    except (ImportError, SystemExit):
        # Metadata asked for without grpcio-tools (or the protos): a bound that any recent build
        # satisfies.
        return "protobuf>=5.26"
    match = re.search(r"Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        return "protobuf>=5.26"
    major, minor, patch = (int(g) for g in match.groups())
    return f"protobuf>={major}.{minor}.{patch},<{major + 1}"


class BuildPyWithProtos(build_py):
    """build_py that also writes the generated modules into the build tree (or, for an editable
    install, beside the sources, where .gitignore keeps them out of git)."""

    def run(self) -> None:
        super().run()
        target = HERE if getattr(self, "editable_mode", False) else Path(self.build_lib)
        generate(target)
        init = target / "trainerd" / "v1" / "__init__.py"
        if not init.exists():
            shutil.copyfile(HERE / "trainerd" / "v1" / "__init__.py", init)


class SdistWithProtos(sdist):
    """sdist that carries a copy of the .proto files (proto/ in the archive), so that a wheel can
    be built from it away from this repository."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        source = proto_dir()
        for name in PROTO_FILES:
            destination = Path(base_dir) / "proto" / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, destination)


setup(
    install_requires=[
        "grpcio>=1.60",
        protobuf_requirement(),
        "numpy>=1.24",
        "PyYAML>=6.0",
    ],
    cmdclass={"build_py": BuildPyWithProtos, "sdist": SdistWithProtos},
)
