"""`python -m facetrain ARGS` for tests, forked from a server that has already imported the training stack.

A `facetrain` process spends about 4 s of a core importing torch, torchvision, DCP and facetrain before it
does anything, and the suite starts hundreds of them. `run` instead asks a server, started once per pytest
process, to fork a child that does what `python -m facetrain ARGS` does after its imports: `runpy` runs
facetrain's `__main__` with the test's argv, working directory and environment, stdin from /dev/null and
stdout/stderr captured, and the child ends through the interpreter's own shutdown. The command still runs
in a process of its own, with its own exit code, signals, children and atexit handlers.

Where a fork could differ from a fresh interpreter (a variable that Python, OpenMP, torch or Triton reads
when it starts differs from the server's), `run` answers None and the caller starts a plain interpreter.
FACETRAIN_TEST_FORKED_CLI=0 turns the server off for a whole session.

`start` forks a command that runs in the background, in a session of its own as
`subprocess.Popen(..., start_new_session=True)` starts it, and answers the part of Popen the fault tests
use (`Started`): they signal it, its process group or the processes below it, and wait for it.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Read when the interpreter, a native library or an imported module starts, so fixed by the server's own start.
START_VARIABLES = (
    "PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_", "MALLOC", "TORCH", "PYTORCH",
    "CUDA", "NVIDIA", "TRITON", "MPL", "OPENCV", "LANG", "LC_",
)  # fmt: skip

# What `facetrain train` imports before it trains, and the libraries most other commands import.
PRELOAD = (
    "numpy",
    "cv2",
    "torch",
    "torchvision",
    "torch.distributed.checkpoint",
    "torch.distributed.elastic.multiprocessing",
    "facetrain.cli",
    "facetrain.cli.train_cmd",
    "facetrain.config",
    "facetrain.train.rank",
    "facetrain.train.run_checks",
    "facetrain.train.run_config",
    "facetrain.train.step_gate",
    "facetrain.parallel.launch",
    "facetrain.checkpoint.run_dir",
    "facetrain.run_log",
)


def start_variables(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith(START_VARIABLES)}


class Server:
    """The server process of one pytest process, and the environment it started with."""

    def __init__(self, env: dict[str, str], python: str | None = None):
        """`python`: another interpreter (a venv with facetrain installed), whose server runs a copy of
        this file from a folder of its own, so that facetrain comes from that interpreter's packages."""
        self.folder = tempfile.mkdtemp(prefix="facetrain-cli-")
        self.address = os.path.join(self.folder, "socket")
        self.env = env
        self.python = python or sys.executable
        if python is None:
            command, cwd = [self.python, "-m", "tests.support.cli_zygote", self.address], REPO
        else:
            command = [self.python, shutil.copy(__file__, self.folder), self.address]
            cwd = Path(self.folder)
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,  # its end tells the server that this process is gone
            stdout=subprocess.PIPE,
            text=True,
        )
        answer = self.process.stdout.readline().strip()
        if answer not in ("ready", "threads"):
            raise RuntimeError(f"the forked-CLI server did not start (exit {self.process.wait()})")
        # never from a server with other threads, whose held locks a child would inherit
        self.forks = answer == "ready"
        atexit.register(self.stop)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str], timeout: float, module: str = "facetrain"
    ) -> subprocess.CompletedProcess:
        command = [self.python, "-m", module, *args]
        with tempfile.TemporaryDirectory(dir=self.folder) as output:
            stdout, stderr = Path(output, "stdout"), Path(output, "stderr")
            request = _request(module, args, cwd, env, stdout, stderr)
            with socket.socket(socket.AF_UNIX) as connection:
                connection.connect(self.address)
                connection.sendall(json.dumps(request).encode() + b"\n")
                replies = connection.makefile("r")
                pid = json.loads(replies.readline())["pid"]
                connection.settimeout(timeout)
                try:
                    returncode = json.loads(replies.readline())["returncode"]
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)  # what subprocess.run does to a command past its timeout
                    connection.settimeout(None)
                    connection.makefile("r").readline()  # its exit: the timed-out reader cannot read again
                    raise subprocess.TimeoutExpired(
                        command, timeout, stdout.read_text(), stderr.read_text()
                    ) from None
            return subprocess.CompletedProcess(command, returncode, stdout.read_text(), stderr.read_text())

    def start(self, args: list[str], cwd: Path, env: dict[str, str], module: str) -> Started:
        output = Path(tempfile.mkdtemp(dir=self.folder))
        stdout, stderr = output / "stdout", output / "stderr"
        stdout.touch(), stderr.touch()  # read through as the child writes, as from a pipe
        request = {**_request(module, args, cwd, env, stdout, stderr), "session": True}
        connection = socket.socket(socket.AF_UNIX)
        connection.connect(self.address)
        connection.sendall(json.dumps(request).encode() + b"\n")
        replies = connection.makefile("rb", buffering=0)  # nothing read ahead that `poll` could miss
        pid = json.loads(replies.readline())["pid"]
        return Started([self.python, "-m", module, *args], pid, connection, replies, output)


def _request(
    module: str, args: list[str], cwd: Path, env: dict[str, str], stdout: Path, stderr: Path
) -> dict:
    return {
        "module": module,
        "argv": args,
        "cwd": str(cwd),
        "env": env,
        "stdout": str(stdout),
        "stderr": str(stderr),
    }


class Started:
    """A command forked in the background (`start`), with what the tests use of `subprocess.Popen`: its
    pid (the leader of its own session and process group), poll, wait, communicate, send_signal and kill,
    and stdout and stderr to read (as text, from the start, as through a pipe). The server, its parent,
    reaps it and sends its exit code."""

    def __init__(self, args: list[str], pid: int, connection: socket.socket, replies, output: Path):
        self.args, self.pid, self.returncode = args, pid, None
        self._connection, self._replies, self._output = connection, replies, output
        self.stdout = (output / "stdout").open()
        self.stderr = (output / "stderr").open()

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._connection], [], [], 0)[0]:
            self._exited(self._replies.readline())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                line = self._replies.readline()
            except TimeoutError:
                # a timed-out reader cannot read again
                self._replies = self._connection.makefile("rb", buffering=0)
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self._exited(line)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """stdout and stderr once the command has exited (what was not read yet), as Popen's."""
        self.wait(timeout)
        return self.stdout.read(), self.stderr.read()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _exited(self, line: bytes) -> None:
        if not line:  # the server went away: its children with it
            raise RuntimeError(f"the forked-CLI server ended while {self.pid} ran")
        self.returncode = json.loads(line)["returncode"]
        self._connection.close()

    def __del__(self) -> None:
        self._connection.close()
        self.stdout.close()
        self.stderr.close()
        shutil.rmtree(self._output, ignore_errors=True)


_server: Server | None = None
_server_lock = threading.Lock()


def run(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float, module: str = "facetrain"
) -> subprocess.CompletedProcess | None:
    """`python -m MODULE ARGS` (facetrain, or a test's wrapper of it such as tests.support.fault_injection)
    forked from the server, or None where it must start a fresh interpreter."""
    server = _server_for(env)
    return None if server is None else server.run(args, cwd, env, timeout, module)


def start(args: list[str], cwd: Path, env: dict[str, str], module: str = "facetrain") -> Started | None:
    """`python -m MODULE ARGS` forked from the server in a session of its own, running in the
    background; None where it must be a fresh interpreter (as for `run`)."""
    server = _server_for(env)
    return None if server is None else server.start(args, cwd, env, module)


def _server_for(env: dict[str, str]) -> Server | None:
    """This process's server (started on first use), or None where a fork could differ from a fresh
    interpreter started with `env`."""
    global _server
    if os.environ.get("FACETRAIN_TEST_FORKED_CLI") == "0":
        return None
    with _server_lock:
        if _server is None or not _server.alive():
            _server = Server(env)
        server = _server
    if not server.forks or start_variables(env) != start_variables(server.env):
        return None
    return server


# ---- the server's side ----


def serve(listener: socket.socket) -> dict:
    """Forks a child for each request and reports its pid and exit code; returns only in a child, with
    its request. Ends the server when its owner's end of stdin closes."""
    waiting: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [], 0.05)
        if sys.stdin in ready and not sys.stdin.readline():
            for pid in waiting:
                os.kill(pid, signal.SIGKILL)
            sys.exit(0)
        if listener in ready:
            connection, _ = listener.accept()
            request = json.loads(connection.makefile("r").readline())
            session_made, made = os.pipe()
            pid = os.fork()
            if pid == 0:
                if request.get("session"):
                    os.setsid()  # before the pid is handed out: a test may signal its group at once
                os.close(made)
                os.close(session_made)
                listener.close()
                for other in (connection, *waiting.values()):
                    other.close()
                return request
            os.close(made)
            os.read(session_made, 1)  # b"" once the child closed its end
            os.close(session_made)
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = connection
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = waiting.pop(pid)
            try:
                connection.sendall(
                    json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n"
                )
            except OSError:  # the test gave up on it
                pass
            connection.close()


def become_the_command(request: dict) -> None:
    """The child: the state a fresh `python -m MODULE` has after its imports, then MODULE's main."""
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = ["-m", *request["argv"]]  # runpy puts the module's path first, as `-m` does
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def main(address: str) -> None:
    # what a process started from a shell has, whatever the pytest process that started this one ignores
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in PRELOAD:
        __import__(name)
    if len(os.listdir("/proc/self/task")) > 1:
        print("threads", flush=True)
        sys.stdin.read()  # until the owner is gone
        return
    gc.freeze()  # a child's garbage collections and shutdown then leave the server's pages shared
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen(16)
    print("ready", flush=True)
    become_the_command(serve(listener))


if __name__ == "__main__":
    main(sys.argv[1])
