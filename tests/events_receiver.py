"""A webhook receiver on loopback for the events tests: logs every request it gets, whole.

Each POST is appended to ``DIR/received.jsonl`` as ``{"headers", "body", "answered"}`` (one
line, flushed before the answer is sent; ``path`` is the request's target as sent: a proxied
request's is the whole URL). The answer is the status code written in ``DIR/answer`` when that
file exists (``500``, ``410``...; ``410|Bye`` gives the reason phrase ``Bye``), else 200.
Prints its port, then serves until killed.

HTTP/1.0 by default (a connection per request); ``--keep-alive``: HTTP/1.1, connections kept
open between requests; ``--tls CERT KEY``: HTTPS with that certificate chain and key.

usage: python events_receiver.py DIR [PORT] [--keep-alive] [--tls CERT KEY]
"""

from __future__ import annotations

import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DIR = Path(sys.argv[1])
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        answer_file = DIR / "answer"
        given = answer_file.read_text() if answer_file.exists() else "200"
        code, _, phrase = given.partition("|")
        answer = int(code)
        line = {
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode(),
            "answered": answer,
        }
        with LOCK, (DIR / "received.jsonl").open("a") as log:
            log.write(json.dumps(line) + "\n")
        self.send_response(answer, phrase or None)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    args = sys.argv[2:]
    port = int(args.pop(0)) if args and not args[0].startswith("--") else 0
    if "--keep-alive" in args:
        Handler.protocol_version = "HTTP/1.1"
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    if "--tls" in args:
        at = args.index("--tls")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args[at + 1], args[at + 2])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
