"""``POST /api/runs/{id}/cancel`` with ``{"before_start": true}`` (CONTRACT.md, "HTTP API" and
"Command line"): an id no run has yet is remembered (202, ``"remembered": [id]``), and the run
then submitted with that id through the API is recorded ``cancelled`` with nothing run; after
the TTL it is forgotten."""

from __future__ import annotations

import time
from pathlib import Path

from _serve import start_server


def test_a_stop_pressed_before_the_run_exists(tmp_path: Path, store_url: str) -> None:
    with start_server(tmp_path, store_url) as served:
        answer = served.post("/api/runs/p1/cancel", {"before_start": True, "reason": "stop"})
        assert answer.status == 202, answer.body
        assert answer.json() == {"id": "p1", "state": None, "remembered": ["p1"]}
        assert served.post("/api/runs", {"task": "quick", "id": "p1"}).status == 201
        run = served.get("/api/runs/p1").json()
        assert (run["state"], run["reason"], run["steps"], run["partials"]) == (
            "cancelled",
            "stop",
            [],
            [],
        )
        # forgotten after its TTL: a run submitted then is worked
        ttl = 0.2
        answer = served.post("/api/runs/p2/cancel", {"before_start": True, "ttl": ttl})
        assert answer.json()["remembered"] == ["p2"]
        until = time.time() + ttl
        while time.time() <= until:
            time.sleep(0.02)
        assert served.post("/api/runs", {"task": "quick", "id": "p2"}).status == 201
        served.wait_for("p2", "completed", lambda run: run["state"] == "completed")
        # an existing id is cancelled as usual; without before_start an unknown id is a 404
        answer = served.post("/api/runs/p2/cancel", {"before_start": True})
        assert answer.json() == {"id": "p2", "state": "completed", "remembered": []}
        assert served.post("/api/runs/p3/cancel", {}).status == 404
        assert served.post("/api/runs/p3/cancel", {"before_start": True, "ttl": 0}).status == 422
