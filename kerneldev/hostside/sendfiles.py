"""Send several files of the host down one stream: one remote command for any number of files.

Self-contained like `_hashfiles.py`: `SSHTransport.stream_files` sends this source to the host
and runs it with `python3 -c`, the paths as JSON on stdin (so any name survives), and reads
the framed bytes from its stdout. Standard library only, Python 3.6 compatible.

Framing, per file in request order: any number of `D` records (a chunk of its bytes), then
one `E` record (end of the file) or one `X` record (the file could not be read; the payload is
the reason, UTF-8). A record is a 1-byte type, an 8-byte big-endian length, then the payload.
Chunks are bounded, so neither side holds a whole file in memory.
"""

import json
import os
import stat
import struct
import sys

CHUNK = 1 << 18
HEADER = struct.Struct(">cQ")


def send(paths, out):
    for path in paths:
        try:
            f = open(path, "rb")
        except OSError as err:
            _record(out, b"X", (err.strerror or str(err)).encode("utf-8", "replace"))
            continue
        with f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                _record(out, b"X", b"not a regular file")
                continue
            while True:
                try:
                    block = f.read(CHUNK)
                except OSError as err:
                    _record(out, b"X", (err.strerror or str(err)).encode("utf-8", "replace"))
                    break
                if not block:
                    _record(out, b"E", b"")
                    break
                _record(out, b"D", block)
    out.flush()


def _record(out, kind, payload):
    out.write(HEADER.pack(kind, len(payload)))
    out.write(payload)


def main():
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    try:
        send(request["paths"], sys.stdout.buffer)
    except BrokenPipeError:
        pass  # the reader went away (an interrupted pull): nothing to report to anyone


if __name__ == "__main__":
    main()
