"""A throwaway Spark standalone cluster (a master and its workers) on 127.0.0.1.

The daemons come from pyspark's own distribution (``pyspark/bin/spark-class``
``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), so nothing
beyond the pip package and Java is needed.  Each worker offers a small share of the
machine (one core, 1 GiB for executors by default) and keeps its executors' folders
and logs under the cluster's temporary folder; a driver connects with
``--master`` :attr:`SparkCluster.master_url` (``pgcdc spark --master spark://...``,
``spark-submit --master spark://...``).  Everything is on one machine, so a local
folder is a path every executor shares (the lake, the checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from core.errors import TerminalError
from core.java import java_binary
from pgcdc.services.ports import free_port, wait_for_port

log = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """pyspark's own distribution: ``bin/spark-class``, ``bin/spark-submit`` and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).parent


class SparkCluster:
    """A standalone master and ``workers`` workers, each its own JVM (and process group, which
    its executors join), stopped and removed on exit.

    ``worker_memory`` must hold one executor (``spark.executor.memory``, 1g by default);
    ``daemon_memory`` is the heap of the master and worker daemons themselves.
    """

    def __init__(self, *, workers: int = 2, worker_cores: int = 1, worker_memory: str = "1g",
                 daemon_memory: str = "256m") -> None:
        self.java = java_binary()
        self.home = spark_home()
        self.workers = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.daemon_memory = daemon_memory
        self.port = free_port()
        self.webui_port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="pgcdc-spark-"))
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def worker_dir(self, index: int) -> Path:
        """Where worker ``index`` keeps its executors: ``<app id>/<executor id>/stderr``."""
        return self.base / f"worker-{index}"

    def start(self, timeout: float = 120.0) -> SparkCluster:
        self._launch("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port),
                                "--webui-port", str(self.webui_port)])
        if not wait_for_port(self.port, timeout=timeout) or not self._master_ui(timeout):
            self._fail(f"the Spark master did not listen on port {self.port} and serve its "
                       f"web UI on {self.webui_port} within {timeout:.0f}s")
        for index in range(self.workers):
            work = self.worker_dir(index)
            work.mkdir()
            self._launch(f"worker-{index}", [
                WORKER_CLASS, "--host", "127.0.0.1", "--webui-port", str(free_port()),
                "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                "--work-dir", str(work), self.master_url])
        if not self._workers_alive(timeout):
            self._fail(f"{self.workers} Spark workers did not register with the master "
                       f"within {timeout:.0f}s")
        log.info("spark cluster started at %s with %d workers", self.master_url, self.workers)
        return self

    def status(self) -> dict[str, Any]:
        """The master's view (its web UI's JSON): ``workers``, ``activeapps``,
        ``completedapps``, ..."""
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - our own master
            status: dict[str, Any] = json.load(response)
        return status

    def stop(self) -> None:
        """Workers first (their executors with them: the process group), then the master."""
        procs, self._procs = self._procs, []
        for proc in reversed(procs):
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.wait(timeout=10)
            self._signal(proc, signal.SIGKILL)  # executors left behind in its group

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()

    def log_tail(self, lines: int = 30) -> str:
        """The end of each daemon's log."""
        tails = []
        for logfile in sorted(self.base.glob("*.log")):
            text = logfile.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {logfile.name}\n" + "\n".join(text))
        return "\n".join(tails)

    # --- internals ------------------------------------------------------------------------

    def _launch(self, name: str, argv: list[str]) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "JAVA_HOME": os.environ.get(
                "JAVA_HOME", str(Path(os.path.realpath(self.java)).parent.parent)),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_LOG_DIR": str(self.base),
            "SPARK_CONF_DIR": str(self.base),  # no spark-defaults.conf or spark-env.sh of the host
        }
        with (self.base / f"{name}.log").open("ab") as out:
            self._procs.append(subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *argv], env=env, cwd=self.base,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    def _master_ui(self, timeout: float) -> bool:
        """Whether the master serves its status on :attr:`webui_port` (before the workers
        start: a worker's web UI, given a free port while the master's was not bound yet,
        could take it, and the master would move to the next one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in self._procs):
                return False
            try:
                self.status()
                return True
            except (OSError, ValueError):  # not up yet (ValueError: not its JSON)
                time.sleep(0.5)
        return False

    def _workers_alive(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in self._procs):
                return False
            try:
                alive = [w for w in self.status().get("workers", []) if w.get("state") == "ALIVE"]
            except OSError:  # the web UI is not up yet
                alive = []
            if len(alive) >= self.workers:
                return True
            time.sleep(0.5)
        return False

    def _fail(self, what: str) -> NoReturn:
        tail = self.log_tail()
        self.stop()
        msg = f"{what}:\n{tail}"
        raise TerminalError(msg)

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
