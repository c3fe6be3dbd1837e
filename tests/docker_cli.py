"""What the real `docker` CLI takes from an env file, for tests that check kerneldev's model of
it (`kerneldev.service.envfile`).

`docker run --env-file` reads the file in the CLI (cli/opts/envfile.go) and sends the result
to the daemon as the container's `Env`. No Docker daemon can run here (it needs root, cgroups
and a container runtime; CI machines have none), so `EnvRecorder` stands in for the daemon:
a minimal Docker Engine API on a unix socket that answers the CLI's ping and records the
`Env` of its container-create request, then refuses the request. What is tested is the CLI's
own reading; the stand-in only listens.
"""

from __future__ import annotations

import json
import os
import shutil
import socketserver
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

DOCKER = shutil.which("docker")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _answer(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Api-Version", "1.41")
        self.send_header("Ostype", "linux")
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(200, b"OK", "text/plain")

    def do_GET(self) -> None:  # noqa: N802
        if self.path.endswith("/_ping"):
            self._answer(200, b"OK", "text/plain")
        else:
            self._answer(404, b'{"message":"not served here"}')

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "/containers/create" in self.path:
            self.server.envs.append(json.loads(body).get("Env") or [])
        self._answer(500, b'{"message":"recorded by the test; no container is made"}')

    def log_message(self, *args) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    envs: list[list[str]]

    def get_request(self):
        conn, _ = super().get_request()
        return conn, ("local", 0)  # http.server wants an address it can print


class EnvRecorder:
    """The stand-in daemon, on a short socket path (unix socket paths are limited to 108
    bytes); `env_of(path, env)` runs `docker run --env-file path` against it."""

    def __enter__(self) -> EnvRecorder:
        self.folder = tempfile.mkdtemp(prefix="kd-docker-")
        self.socket = os.path.join(self.folder, "d.sock")
        self.server = _Server(self.socket, _Handler)
        self.server.envs = []
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def env_of(self, path: Path, env: dict[str, str] | None = None) -> list[str] | str:
        """The `Env` the CLI sent for `--env-file path` (run with `env` as its environment
        besides PATH), or, when it refused the file, its error line."""
        assert DOCKER is not None
        before = len(self.server.envs)
        done = subprocess.run(
            [DOCKER, "run", "--env-file", str(path), "kerneldev-test-image", "true"],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                "PATH": os.environ.get("PATH", ""),
                "DOCKER_HOST": f"unix://{self.socket}",
                "DOCKER_CONFIG": self.folder,  # none of the user's contexts or credentials
                **(env or {}),
            },
        )
        if len(self.server.envs) > before:
            return self.server.envs[-1]
        return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
