"""Daemons on loopback for the benchmarks that run several (data_parallel_daemons.py,
spread_sweep.py): a free port, and a trainerd started over its own data folder with the others
as its --peers."""
from __future__ import annotations

import os
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(build_dir: str, work: str, listen: str, peers: str, name: str,
          *flags: str) -> subprocess.Popen[str]:
    """Starts trainerd on `listen` over <work>/<name> (its log <work>/<name>.log) on the CPU, with
    `flags` added, and returns once it listens."""
    proc = subprocess.Popen(
        [os.path.join(build_dir, "server", "trainerd"), f"--listen={listen}",
         f"--data_dir={work}/{name}", "--device=cpu", "--metrics_listen=",
         "--diagnose_at_start=false", f"--peers={peers}", f"--node_name={name}", *flags],
        stdout=subprocess.PIPE, stderr=open(os.path.join(work, f"{name}.log"), "w"), text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "listening on" not in line:
        raise RuntimeError(f"trainerd did not start: {line!r}")
    return proc
