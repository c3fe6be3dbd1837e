"""A TCP forwarder on 127.0.0.1 to a local port: a stand-in network between kerneldev and a
sandbox host's sshd, which a subclass shapes (the reliability tests cut it, the sync
benchmark delays it).

`LoopbackProxy(target_port)` listens on a free loopback port (`.port`) and, for every
connection, opens one to `target_port` and hands both sockets to `_forward`.
"""

from __future__ import annotations

import abc
import socket
import threading


class LoopbackProxy(abc.ABC):
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @abc.abstractmethod
    def _forward(self, client: socket.socket, server: socket.socket) -> None:
        """Carry one connection's bytes both ways (start threads; return at once)."""

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()  # nothing listens at the target: as a refused connection
                continue
            self._forward(client, server)

    def close(self) -> None:
        self.listener.close()
