"""The systems compared, each a fresh process started by the benchmark in the same run."""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kvstore.engine import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "kvbench"
# The S3 targets' bucket: a real SeaweedFS (tests/seaweed.py), one per bench run, on loopback.
_seaweed = None


def seaweed():
    """The run's SeaweedFS (started on first use, stopped at exit) with the bucket BUCKET."""
    global _seaweed
    if _seaweed is None:
        if str(ROOT / "tests") not in sys.path:
            sys.path.insert(0, str(ROOT / "tests"))
        from seaweed import SeaweedFS

        d = Path(tempfile.mkdtemp(prefix="kvbench-seaweed-"))
        sw = SeaweedFS(d).start()
        atexit.register(lambda: (sw.stop(), shutil.rmtree(d, ignore_errors=True)))
        sw.create_bucket(BUCKET)
        _seaweed = sw
    return _seaweed


@contextlib.contextmanager
def bucket_env(env: dict, drop: tuple = ()):
    """This process talks to the run's bucket inside the block: `env` set (and `drop` unset), all restored after."""
    keys = set(env) | set(drop)
    saved = {k: os.environ.get(k) for k in keys}
    for k in drop:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class TargetSpec:
    name: str  # shown in the table
    kind: str  # "llama" (plain llama.cpp server) or "kvstore" (kvstore serve in front of one)
    cache_ram: int = 0  # llama-server --cache-ram MiB
    servers: int = 1  # > 1: that many `kvstore serve` on one S3 store, each request of a user on the next one
    balance: str = ""  # "name" | "roundrobin": the servers behind a real HAProxy (kvstore balancer-config) instead
    bucket: bool = False  # an S3 store even for one server
    # > 0: `kvstore serve --max-size` this fraction of what the uncapped kvstore target stored for the same workload
    # in the same run (bench/__main__.py passes the size; the uncapped target must run first)
    cap_of_uncapped: float = 0.0
    serve_args: tuple = ()  # more `kvstore serve` flags


TARGETS = {
    "plain": TargetSpec("llama-server", "llama", 0),
    "ram": TargetSpec("llama-server --cache-ram 8192", "llama", 8192),
    "ram512": TargetSpec("llama-server --cache-ram 512", "llama", 512),
    "kvstore": TargetSpec("kvstore serve", "kvstore", 0),
    "kvcap": TargetSpec("kvstore serve --max-size 50%", "kvstore", 0, cap_of_uncapped=0.5),
    # Every stored state restored, whatever the cost model predicts: the token path where recomputing is faster (a
    # tiny model evaluates a prompt quicker than any restore).
    "kvalways": TargetSpec("kvstore serve --restore-policy always", "kvstore", 0,
                           serve_args=("--restore-policy", "always")),
    # Sliding-window models: a returning user's state cut at its end instead of resumed at llama-server's own
    # checkpoint before the last reply (no difference on other models).
    "kvend": TargetSpec("kvstore serve --resume-at end", "kvstore", 0, serve_args=("--resume-at", "end")),
    "s3x2": TargetSpec("2x kvstore serve, one S3 store", "kvstore", 0, servers=2),
    "s3x1": TargetSpec("1x kvstore serve, S3 store", "kvstore", 0, bucket=True),
    "lb-rr": TargetSpec("2x kvstore serve, HAProxy round-robin", "kvstore", 0, servers=2, balance="roundrobin"),
    "lb-name": TargetSpec("2x kvstore serve, HAProxy by name", "kvstore", 0, servers=2, balance="name"),
}
# With several servers a user's newest state must reach the bucket before their next turn lands elsewhere: the
# servers save a slot this long after its last request (instead of the default 30 s).
S3_IDLE_SAVE = "0.5"


class Target:
    """A running target; `restart()` stops and starts it again on the same store (W3)."""

    def __init__(self, spec: TargetSpec, model: str, parallel: int, ctx_size: int, workdir: Path,
                 max_size: Optional[int] = None):
        self.spec, self.model, self.parallel, self.ctx_size = spec, model, parallel, ctx_size
        self.max_size = max_size  # kvstore serve --max-size, bytes
        self.workdir = workdir
        self.store = workdir / "store"
        self.log = open(workdir / f"{spec.kind}-{spec.cache_ram}.log", "ab")
        self.procs: list = []
        self.urls: list[str] = []
        self.remote: Optional[str] = None  # s3://... for a several-server target
        self.env: Optional[dict] = None
        self.balancer = None  # tests/haproxy.py's HAProxy, for a target with spec.balance
        if spec.servers > 1 or spec.bucket:
            sw = seaweed()
            self.remote = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
            self.env = sw.env()
        self._carried: dict = {}
        self.start()

    @property
    def proc(self):
        return self.procs[0] if self.procs else None

    @property
    def url(self) -> str:
        return self.urls[0]

    def url_for(self, session_index: int, turn: int) -> str:
        """Where a session's turn goes: the balancer; else with several servers, each turn on the next one (the
        worst locality)."""
        if self.balancer is not None:
            return self.balancer.url
        return self.urls[(session_index + turn) % len(self.urls)]

    def start(self) -> None:
        self.procs, self.urls = [], []
        for i in range(self.spec.servers):
            port = free_port()
            common = ["-m", self.model, "-np", str(self.parallel), "-c", str(self.ctx_size),
                      "--cache-ram", str(self.spec.cache_ram), "--port", str(port)]
            if self.spec.kind == "llama":
                cmd = [sys.executable, "-m", "kvstore.engine", *common]
            elif self.remote:
                cmd = [sys.executable, "-m", "kvstore.cli", "serve", "--store", self.remote, "--cache",
                       str(self.workdir / f"cache{i}"), "--idle-save", S3_IDLE_SAVE, *common]
            else:
                cmd = [sys.executable, "-m", "kvstore.cli", "serve", "--store", str(self.store), *common]
            if self.max_size is not None and self.spec.kind == "kvstore":
                cmd += ["--max-size", str(self.max_size)]
            cmd += list(self.spec.serve_args)
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
            self.procs.append(proc)
            self.urls.append(f"http://127.0.0.1:{port}")
            try:
                wait_healthy(self.urls[-1], timeout=180, alive=lambda: proc.poll() is None)
            except RuntimeError as e:
                raise RuntimeError(f"{self.spec.name}: {e}; see {self.log.name}") from None
        if self.spec.balance:
            from haproxy import HAProxy  # tests/haproxy.py (on sys.path since seaweed() ran)

            self.balancer = HAProxy(self.workdir / "haproxy", self.urls, balance=self.spec.balance).start()

    def stop(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()
            self.balancer = None
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []

    def restart(self) -> None:
        # Counters live in the process: keep what this run counted before the restart. Gauges (the store's bytes
        # and names, the queue) are not carried: after the restart the live value is the whole value, and a sum
        # over restarts would report a store larger than its disk holds (W3 with --max-size did, before).
        carry_counters(self._carried, *self._scrape())
        self.stop()
        self.start()

    def rss_bytes(self) -> int:
        """Resident memory of the target processes (the llama.cpp server runs in each)."""
        total = 0
        for proc in self.procs:
            try:
                for line in open(f"/proc/{proc.pid}/status"):
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                pass
        return total

    def metrics(self) -> dict:
        """kvstore's counters from /metrics (Prometheus text), as {name: value}, summed over restarts."""
        out = dict(self._carried)
        for k, v in self._live_metrics().items():
            out[k] = out.get(k, 0.0) + v
        return out

    def _live_metrics(self) -> dict:
        """Summed over the servers."""
        return self._scrape()[0]

    def _scrape(self) -> tuple[dict, set]:
        """One read of each server's /metrics (`scrape`): the samples summed over the servers, and the gauges."""
        out: dict = {}
        gauges: set = set()
        for url in self.urls:
            try:
                samples, declared = scrape(url)
            except OSError:
                continue
            for key, value in samples.items():
                out[key] = out.get(key, 0.0) + value
            gauges |= declared
        return out, gauges

    def store_bytes(self) -> int:
        if self.remote:  # what the bucket holds under the store's prefix
            return seaweed().bucket_bytes(BUCKET, self.remote[len(f"s3://{BUCKET}/"):] + "/")
        total = 0
        for p in self.store.rglob("*"):
            if p.is_file():
                total += p.stat().st_size
        return total

    def close(self) -> None:
        self.stop()
        self.log.close()


def scrape(url: str, headers: Optional[dict] = None) -> tuple[dict, set]:
    """One read of a server's /metrics (Prometheus text): {sample: value}, keyed `name{labels}`, and the families
    it declares as gauges (`# TYPE name gauge`). OSError when the server does not answer."""
    samples: dict = {}
    gauges: set = set()
    with urllib.request.urlopen(urllib.request.Request(url + "/metrics", headers=headers or {}), timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("#"):
                parts = line.split()
                if parts[:2] == ["#", "TYPE"] and len(parts) == 4 and parts[3] == "gauge":
                    gauges.add(parts[2])
            elif line:
                key, _, value = line.rpartition(" ")
                try:
                    samples[key] = samples.get(key, 0.0) + float(value)
                except ValueError:
                    pass
    return samples, gauges


def family_total(samples: dict, name: str) -> float:
    """A family's samples (`scrape`) summed over their labels."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def carry_counters(carried: dict, live: dict, gauges: set) -> None:
    """Add to `carried` the samples of `live` ({sample: value}, labels included in the key) that count: every
    family but the `gauges` (a gauge's value after a restart is the whole value)."""
    for key, value in live.items():
        if key.split("{", 1)[0] not in gauges:
            carried[key] = carried.get(key, 0.0) + value


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="kvbench-"))


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
