"""`python -m fedlight ARGS` as a real process without paying Python's, torch's and Lightning's start-up again:
forked from a server process that imported fedlight's command line and what a run loads once (multiprocessing's
forkserver, preloaded).
On 2 cores that start-up costs about 10 s of CPU per process, most of the time of the tests that start processes.

A `Prestarted` behaves as the `subprocess.Popen` those tests used (pid, poll, communicate, kill, send_signal, a
signal's death as a negative return code), with its own working folder, environment, argv and standard streams; the
exit code is what `python -m fedlight` would return. Tests of start-up itself (Ctrl-C while torch loads, the
start-up benchmark, installs, launchers that start interpreters) still start real interpreters. Processes that
fedlight's own launcher starts (`--federation.devices 2`) are real interpreters too: the launcher runs
`python -m fedlight.__main__ ARGS`, as it would from the command line.
"""

from __future__ import annotations

import atexit
import importlib.util
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

_CONTEXT = None
#: what the server imports once: the command line, and what a run imports after it (it imports them lazily, so a
#: server holding the command line alone left each process about 4 s of importing Lightning, torchmetrics and
#: torchvision on 2 cores)
PRELOADED = [
    "fedlight.run.cli",
    "lightning",
    "fedlight.engine.federation",
    "fedlight.algorithms",
    "fedlight.datamodules",
    "fedlight.models",
]


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOADED)
    return _CONTEXT


def _child(args: list[str], cwd: str, env: dict[str, str], out_path: str, err_path: str, own_group: bool) -> None:
    """In the forked process: the folder, environment, streams and argv of `python -m fedlight ARGS`, then its
    main; exit handlers run as at an interpreter's exit (multiprocessing's children skip them). `own_group`: a
    session and process group of its own (`start_new_session`)."""
    if own_group:
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.argv = [str(Path(importlib.util.find_spec("fedlight.__main__").origin)), *args]
    sys.modules["__main__"].__spec__ = importlib.util.find_spec("fedlight.__main__")  # what a launcher re-runs
    from fedlight.__main__ import run

    try:
        code = run()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


class Prestarted:
    """One `python -m fedlight ARGS` in `cwd` with environment `env`, forked from the preloaded server;
    `own_group`: in a process group of its own, as `Popen(start_new_session=True)`."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], own_group: bool = False) -> None:
        self._folder = tempfile.mkdtemp(prefix="fedlight-prestarted-")
        self._out, self._err = os.path.join(self._folder, "out"), os.path.join(self._folder, "err")
        self.args = args
        self._process = _context().Process(
            target=_child, args=(args, str(cwd), dict(env), self._out, self._err, own_group)
        )
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return Path(self._out).read_text(), Path(self._err).read_text()

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fedlight_result(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess:
    """A finished `python -m fedlight ARGS` (as `subprocess.run(..., capture_output=True, text=True)` gives it)."""
    process = Prestarted(args, cwd, env)
    out, err = process.communicate(timeout)
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks_env(env: dict[str, str], world: int = 2) -> list[dict[str, str]]:
    """Each of `world` processes' environment as a launcher (torchrun) gives it on one machine."""
    port = str(free_port())
    return [
        {
            **env,
            "RANK": str(r),
            "LOCAL_RANK": str(r),
            "GROUP_RANK": "0",
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "TORCHELASTIC_RUN_ID": "fedlight-test",
        }
        for r in range(world)
    ]
