"""A webhook receiver on loopback for the events tests: logs every request it gets, whole.

Each POST is appended to ``DIR/received.jsonl`` as ``{"headers", "body", "answered"}`` (one
line, flushed before the answer is sent). The answer is the status code written in
``DIR/answer`` when that file exists (``500``, ``410``...), else 200. Prints its port, then
serves until killed.

usage: python events_receiver.py DIR [PORT]
"""

from __future__ import annotations

import json
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
        answer = int(answer_file.read_text()) if answer_file.exists() else 200
        line = {
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode(),
            "answered": answer,
        }
        with LOCK, (DIR / "received.jsonl").open("a") as log:
            log.write(json.dumps(line) + "\n")
        self.send_response(answer)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
