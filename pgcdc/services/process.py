"""What every throwaway service that runs as one local process shares: stopping it (a paused
one is let run first, so that it can stop), pausing and resuming it (SIGSTOP / SIGCONT:
connections hang, nothing is refused), its folder removed, and the tail of its log."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any, Self


class LocalProcess:
    """A service process (``_proc``) writing ``logfile`` inside its folder ``base``;
    subclasses start it (:meth:`start`)."""

    base: Path
    logfile: Path
    _proc: subprocess.Popen[bytes] | None

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused one must run to stop
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections are accepted and never answered."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
