"""GET a URL as seen from the host: the status line of the answer, for health checks.

The agent transport runs this where the SSH transport opens a direct-tcpip channel: a plain
TCP connection from the host to `host:port`, the same HTTP/1.0 request, and the first line of
the answer (at most 8 KiB read). Request and answer are one JSON object each (stdin, stdout):
`{"ok": true, "head": text}` or `{"ok": false, "refused": bool, "timeout": bool, "error": text}`.
`status_line` is the exchange itself, which the SSH transport runs over its channel too.
Standard library only, Python 3.6 compatible; imports nothing of kerneldev.
"""

import json
import socket
import sys


def probe(request):
    try:
        sock = socket.create_connection(
            (request["host"], request["port"]), timeout=request["timeout"]
        )
    except ConnectionRefusedError as err:
        return {"ok": False, "refused": True, "error": err.strerror or str(err)}
    except TimeoutError:
        return {"ok": False, "timeout": True, "error": "timed out"}
    except OSError as err:
        return {"ok": False, "error": err.strerror or str(err)}
    try:
        with sock:
            head = status_line(sock, request["request"], request["timeout"])
    except TimeoutError:
        return {"ok": False, "timeout": True, "error": "timed out"}
    except OSError as err:
        return {"ok": False, "error": err.strerror or str(err)}
    return {"ok": True, "head": head}


def status_line(conn, request, timeout):
    """Send `request` (text) over `conn`, a connected socket or anything with its settimeout,
    sendall and recv (the SSH transport's direct-tcpip channel), and return the answer's first
    line (at most 8 KiB read); the connection's errors pass through."""
    conn.settimeout(timeout)
    conn.sendall(request.encode("latin-1"))
    buf = b""
    while b"\r\n" not in buf and len(buf) < 8192:
        block = conn.recv(4096)
        if not block:
            break
        buf += block
    return buf.split(b"\r\n", 1)[0].decode("latin-1")


def main():
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdout.write(json.dumps(probe(request)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
