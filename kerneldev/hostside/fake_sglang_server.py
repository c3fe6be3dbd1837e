"""Stands in for SGLang's server: 503 while "loading", then 200 on /health.

The sandbox's restart.sh runs it as `python fake_sglang.py PORT WARMUP` (kerneldev/sandbox/host.py
writes this file into the sandbox's service folder). Standard library only.
"""

import http.server
import sys
import time

warmup = 0.0
started = time.monotonic()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready = time.monotonic() - started >= warmup
        body = b"ok\n" if ready else b"loading\n"
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        sys.stderr.write("fake-sglang: " + (fmt % args) + "\n")


def main():
    global warmup, started
    port, warmup = int(sys.argv[1]), float(sys.argv[2])
    started = time.monotonic()
    # The previous instance may still hold the port for a moment after it was killed.
    for _ in range(200):
        try:
            server = http.server.HTTPServer(("127.0.0.1", port), Handler)
            break
        except OSError:
            time.sleep(0.05)
    else:
        sys.exit("fake-sglang: port %d stays busy" % port)
    print(
        "fake-sglang: listening on 127.0.0.1:%d, healthy after %.1fs" % (port, warmup), flush=True
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
