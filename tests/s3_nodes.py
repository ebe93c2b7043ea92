"""`kvstore serve` processes on one S3 store, as separate machines would run them: each its own embedded
llama-server and its own cache directory; the bucket's address only in their environment (`SeaweedFS.env()`).
A process can be stopped (SIGTERM: it saves its dirty slots), killed (-9) and started again."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

from hooks_support import CTX, ROOT, THREADS

from kvstore.engine import wait_healthy


class Node:
    """One `kvstore serve --store s3://... --cache DIR` with an embedded llama-server (smollm2, 2 slots)."""

    def __init__(self, name: str, store: str, cache: Path, env: dict, *, model: str = "smollm2",
                 idle_save: float = 1.0, extra: tuple = ()):
        self.name, self.store, self.cache, self.env = name, store, Path(cache), dict(env)
        self.model, self.idle_save, self.extra = model, idle_save, tuple(extra)
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""
        self.log_path = self.cache.parent / f"{name}.log"
        self._log_lines: list[str] = []

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "kvstore.cli", "serve", "--store", self.store, "--cache", str(self.cache),
               "-m", self.model, "-np", "2", "-c", str(CTX), "--cache-ram", "0", "-fa", "on", "--port", "0",
               "--idle-save", str(self.idle_save), "--restore-policy", "always", *self.extra]
        if THREADS:
            cmd += ["-t", str(THREADS)]
        return cmd

    def start(self, timeout: float = 300) -> "Node":
        self.cache.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(self.command(), cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=log,
                                     text=True)
        log.close()
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if "listening on http://" not in line:
            self.proc.wait(30)
            raise RuntimeError(f"node {self.name} did not start ({line!r}):\n{self.log_tail()}")
        self.url = line.split("listening on ")[1].split()[0]
        # keep reading its stdout so it never blocks on a full pipe
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        wait_healthy(self.url, timeout, alive=lambda: self.proc is not None and self.proc.poll() is None)
        return self

    def _drain(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            self._log_lines.append(line)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM: finish requests, save dirty slots, exit. Returns the exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
                raise RuntimeError(f"node {self.name} did not stop within {timeout} s:\n{self.log_tail()}")
        return proc.returncode

    def kill(self) -> None:
        """kill -9: no shutdown save, uploads cut wherever they are."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def close(self) -> None:
        try:
            self.stop(60)
        except Exception:  # noqa: BLE001 - closing in teardown
            self.kill()
