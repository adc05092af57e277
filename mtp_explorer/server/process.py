"""A real llama-server process on 127.0.0.1, started and stopped by the code that needs it (tests, benchmarks,
notebooks): a free port, a bounded wait until ``/health`` answers, and a clean shutdown (terminate, then kill)
that leaves no process behind, also when the caller fails."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ..core.cpu_kernels import with_no_repack
from ..core.drafters import DEFAULT_MODE
from ..core.errors import ServerProtocolError, ServerUnavailableError
from .client import ServerClient

#: Where :func:`server_binary` looks first: the llama-server built from the same 0.3.36 sources (``make server``).
ENV_BINARY = "LLAMA_SERVER"
_REPO_BINARY = Path(__file__).resolve().parents[2] / "build" / "reference" / "bin" / "llama-server"


def server_binary(binary: str | os.PathLike | None = None) -> Path:
    """The llama-server to run: ``binary``, else ``$LLAMA_SERVER``, else this checkout's ``build/reference`` one (``make
    server``), else ``llama-server`` on the PATH. Missing: a :class:`ServerUnavailableError` saying so."""
    if binary is not None:
        if not Path(binary).is_file():
            raise ServerUnavailableError(f"no llama-server binary at {binary}")
        return Path(binary)
    for candidate in (os.environ.get(ENV_BINARY), _REPO_BINARY, shutil.which("llama-server")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise ServerUnavailableError(
        f"no llama-server binary: give binary=, set ${ENV_BINARY}, or build it with `make server` (into {_REPO_BINARY})"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """``llama-server -m model -np n_parallel ...`` on 127.0.0.1, as a context manager (or :meth:`start` /
    :meth:`stop`). Flags keep llama.cpp's names: ``n_parallel`` (``-np``), ``n_ctx`` (``-c``, shared by the slots),
    ``threads`` (``-t``), ``spec_type`` (``--spec-type``, e.g. ``"draft-mtp"``; None: no speculative decoding),
    ``n_max`` (``--spec-draft-n-max``), ``p_min`` (``--spec-draft-p-min``), ``draft_model`` (``-md``); ``args``
    are further flags. ``/metrics`` is on; ``-nr`` where llama.cpp's extra CPU buffer types stop the process
    (:func:`~mtp_explorer.check_extra_buffers`). The server's log is kept in a temporary file (:attr:`log`)."""

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        n_parallel: int = 1,
        n_ctx: int = 4096,
        threads: int = 2,
        spec_type: str | None = DEFAULT_MODE,
        n_max: int = 3,
        p_min: float | None = None,
        draft_model: str | os.PathLike | None = None,
        args: Sequence[str] = (),
        binary: str | os.PathLike | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.binary = server_binary(binary)
        self.model = Path(model)
        if not self.model.is_file():
            raise ServerUnavailableError(f"model file not found: {self.model}")
        self.n_parallel = int(n_parallel)
        self.argv_tail = [
            "-m",
            str(self.model),
            "-np",
            str(n_parallel),
            "-c",
            str(n_ctx),
            "-t",
            str(threads),
            "--metrics",
            "--no-webui",
            *(str(a) for a in args),
        ]
        if spec_type is not None:
            self.argv_tail += ["--spec-type", spec_type, "--spec-draft-n-max", str(n_max)]
            if p_min is not None:
                self.argv_tail += ["--spec-draft-p-min", str(p_min)]
        if draft_model is not None:
            self.argv_tail += ["-md", str(draft_model)]
        self.argv_tail = with_no_repack(self.argv_tail)  # a draft model in ``args`` too
        self.startup_timeout = float(startup_timeout)
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        self._log = None

    # -- life cycle ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise ServerUnavailableError("the server is not started")
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 120.0) -> ServerClient:
        """A client of this server."""
        return ServerClient(self.url, timeout=timeout)

    @property
    def log(self) -> str:
        """What the server printed so far."""
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")

    def start(self) -> LlamaServer:
        """Start it and wait (at most ``startup_timeout`` s) until ``/health`` answers; on failure the process is
        stopped and a :class:`ServerUnavailableError` carries the end of its log."""
        if self.process is not None:
            return self
        self._log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        self.port = free_port()
        argv = [str(self.binary), *self.argv_tail, "--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        client = ServerClient(self.url, timeout=2.0)
        while True:
            if self.process.poll() is not None:
                raise ServerUnavailableError(
                    f"llama-server exited with code {self.process.returncode} while starting:\n{self.log[-2000:]}"
                )
            try:
                client.health()
                return
            except (ServerUnavailableError, ServerProtocolError):  # not listening yet, or 503 while loading
                pass
            if time.monotonic() > deadline:
                raise ServerUnavailableError(
                    f"llama-server did not answer /health within {self.startup_timeout:g} s:\n{self.log[-2000:]}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server (kill it after ``timeout`` s) and wait for it; the log file is removed."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
            except BaseException:  # interrupted while it shuts down (a second Ctrl-C): leave nothing running
                proc.kill()
                raise
        if self._log is not None:
            self._log.close()
            Path(self._log.name).unlink(missing_ok=True)
            self._log = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = f"on {self.url}" if self.running else "stopped"
        return f"<LlamaServer {self.model.name} -np {self.n_parallel} {state}>"
