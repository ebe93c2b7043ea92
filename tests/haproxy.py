"""A real HAProxy (Debian's `haproxy`, 2.6+) in front of `kvstore serve` processes, for the tests and the bench.

`HAProxy(work_dir, servers, ...)` writes the configuration `kvstore balancer-config` prints (the same generator,
`kvstore.hooks.balancer.render`), checks it with `haproxy -c`, runs `haproxy -db` (foreground, its log in
`work_dir/haproxy.log`) on a free loopback port, and waits until it listens and every server passed its health
check. `server_states()` reads them from the admin socket; `stop()` ends it (SIGTERM, then SIGKILL).
"""
from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvstore.engine import free_port  # noqa: E402
from kvstore.hooks.balancer import BalancerConfig, render  # noqa: E402

START_TIMEOUT = 60.0


def haproxy_binary() -> str:
    found = shutil.which("haproxy")
    if not found:
        raise RuntimeError("the `haproxy` binary is missing: `apt-get install haproxy` (./dev test installs it)")
    return found


class HAProxy:
    def __init__(self, work_dir: Path | str, servers: Sequence[str], **options):
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.socket_path = self.work_dir / "admin.sock"
        self.cfg = BalancerConfig(listen="127.0.0.1:0", servers=tuple(servers), log=True,
                                  stats_socket=str(self.socket_path), **options)
        self.config_path = self.work_dir / "haproxy.cfg"
        self.log_path = self.work_dir / "haproxy.log"
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = START_TIMEOUT) -> "HAProxy":
        self.port = free_port()
        self.config_path.write_text(render(replace(self.cfg, listen=f"127.0.0.1:{self.port}")))
        check = subprocess.run([haproxy_binary(), "-c", "-f", str(self.config_path)], capture_output=True,
                               text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c refused {self.config_path}:\n{check.stdout}{check.stderr}")
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([haproxy_binary(), "-db", "-f", str(self.config_path)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        self.wait_up(len(self.cfg.servers), timeout)
        return self

    def wait_up(self, n: int, timeout: float = START_TIMEOUT) -> None:
        """Until `n` servers are UP (their health checks passed) and the frontend accepts connections."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited:\n{self.log_tail()}")
            try:
                states = self.server_states()
                if sum(s == "UP" for s in states.values()) >= n:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                        return
            except OSError:
                states = {}
            if time.monotonic() > deadline:
                raise RuntimeError(f"haproxy: {n} servers not UP within {timeout:.0f} s ({states}):\n"
                                   f"{self.log_tail()}")
            time.sleep(0.2)

    def admin(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.socket_path))
            s.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        return b"".join(chunks).decode()

    def server_states(self) -> dict[str, str]:
        """{server name: UP | DOWN | ...} of the backend, from `show stat` (CSV)."""
        lines = self.admin("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        out = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") == "servers" and row.get("svname") not in ("FRONTEND", "BACKEND"):
                out[row["svname"]] = row["status"].split()[0]
        return out

    def wait_state(self, server: str, state: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.server_states().get(server) != state:
            if time.monotonic() > deadline:
                raise AssertionError(f"{server} not {state} within {timeout} s: {self.server_states()}")
            time.sleep(0.2)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    close = stop

    def __enter__(self) -> "HAProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
