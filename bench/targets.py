"""The systems compared, each a fresh process started by the benchmark in the same run."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kvstore.engine import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class TargetSpec:
    name: str  # shown in the table
    kind: str  # "llama" (plain llama.cpp server) or "kvstore" (kvstore serve in front of one)
    cache_ram: int = 0  # llama-server --cache-ram MiB


TARGETS = {
    "plain": TargetSpec("llama-server", "llama", 0),
    "ram": TargetSpec("llama-server --cache-ram 8192", "llama", 8192),
    "ram512": TargetSpec("llama-server --cache-ram 512", "llama", 512),
    "kvstore": TargetSpec("kvstore serve", "kvstore", 0),
}


class Target:
    """A running target; `restart()` stops and starts it again on the same store (W3)."""

    def __init__(self, spec: TargetSpec, model: str, parallel: int, ctx_size: int, workdir: Path):
        self.spec, self.model, self.parallel, self.ctx_size = spec, model, parallel, ctx_size
        self.workdir = workdir
        self.store = workdir / "store"
        self.log = open(workdir / f"{spec.kind}-{spec.cache_ram}.log", "ab")
        self.proc = None
        self._carried: dict = {}
        self.start()

    def start(self) -> None:
        self.port = free_port()
        common = ["-m", self.model, "-np", str(self.parallel), "-c", str(self.ctx_size),
                  "--cache-ram", str(self.spec.cache_ram), "--port", str(self.port)]
        if self.spec.kind == "llama":
            cmd = [sys.executable, "-m", "kvstore.engine", *common]
        else:
            cmd = [sys.executable, "-m", "kvstore.cli", "serve", "--store", str(self.store), *common]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        try:
            wait_healthy(self.url, timeout=180, alive=lambda: self.proc.poll() is None)
        except RuntimeError as e:
            raise RuntimeError(f"{self.spec.name}: {e}; see {self.log.name}") from None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        # Counters live in the process: keep what this run counted before the restart.
        for k, v in self._live_metrics().items():
            self._carried[k] = self._carried.get(k, 0.0) + v
        self.stop()
        self.start()

    def rss_bytes(self) -> int:
        """Resident memory of the target process (the llama.cpp server runs in it)."""
        try:
            for line in open(f"/proc/{self.proc.pid}/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def metrics(self) -> dict:
        """kvstore's counters from /metrics (Prometheus text), as {name: value}, summed over restarts."""
        out = dict(self._carried)
        for k, v in self._live_metrics().items():
            out[k] = out.get(k, 0.0) + v
        return out

    def _live_metrics(self) -> dict:
        out: dict = {}
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
                for line in r.read().decode().splitlines():
                    if line and not line.startswith("#"):
                        key, _, value = line.rpartition(" ")
                        try:
                            out[key] = float(value)
                        except ValueError:
                            pass
        except OSError:
            pass
        return out

    def store_bytes(self) -> int:
        total = 0
        for p in self.store.rglob("*"):
            if p.is_file():
                total += p.stat().st_size
        return total

    def close(self) -> None:
        self.stop()
        self.log.close()


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="kvbench-"))


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
