"""bench/serve_soak.py at a small size on the demo pair: `serve` for 30 s with an engine killed
every 10 s, bad requests and a client that leaves mid-stream; then the target on an rpc-server in
a network namespace of its own, stopped and started again once. Every completed reply must equal
the quiet server's, no 5xx but 503, /metrics must agree with the clients."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent / "bench" / "serve_soak.py"


def soak(tmp_path, *args) -> tuple[int, dict, str]:
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(SOAK), *map(str, args), "--out", str(out)], capture_output=True,
                          text=True, timeout=400)
    log = (done.stdout + done.stderr)[-4000:]
    assert out.exists(), log
    return done.returncode, json.loads(out.read_text()), log


def assert_goals(run: dict, log: str) -> None:
    assert run["other_5xx"] == 0, (run["requests"], log)
    assert run["replies"]["differing"] == 0, run["replies"]["first_differences"]
    assert run["replies"]["compared"] > 50, run["requests"]
    assert run["metrics"] and all(check["match"] for check in run["metrics"]), run["metrics"]
    assert run["bad_requests"].get("answered as expected", 0) > 5 and not run["bad_requests"].get("wrong answer")
    assert run["disconnects"].get("left mid-stream", 0) > 0, run["disconnects"]
    assert not run["left_behind"] and not run["left_after_stop"]
    assert all(row["flat"] is not False for row in run["memory"]), run["memory"]
    assert not run["failures"], run["failures"]


@pytest.mark.slow
def test_serve_under_engine_kills_bad_requests_and_disconnects(tmp_path):
    rc, report, log = soak(tmp_path, "--seconds", 30, "--kill-every", 10, "--clients", 4, "--sample-every", 3,
                           "--rpc", "off")
    run = report["runs"]["local"]
    assert_goals(run, log)
    kills = [k for k in run["faults"]["engine_kills"] if k["pid"]]
    assert len(kills) >= 2, run["faults"]
    assert run["replies"]["served_after_first_kill"] > 20
    assert rc == 0 and report["missed"] == [], log


@pytest.mark.slow
def test_serve_with_its_target_on_an_rpc_server_that_is_stopped_and_started_again(tmp_path):
    rc, report, log = soak(tmp_path, "--rpc", "only", "--rpc-seconds", 25, "--rpc-outage", 5, "--kill-every", 20,
                           "--clients", 4, "--sample-every", 3)
    run = report["runs"]["rpc"]
    if "skipped" in run:
        pytest.skip(f"the rpc run was not made: {run['skipped']}")
    assert_goals(run, log)
    events = [e["event"] for e in run["faults"]["rpc"]]
    assert events == ["rpc-server killed", "rpc-server started again"], events
    assert run["requests"]["statuses"].get("503 engine_unavailable", 0) > 0  # the outage's designed answer
    assert run["replies"]["served_after_rpc_restart"] > 20
    assert run["namespace"]["left_after_cleanup"] == []
    assert rc == 0 and report["missed"] == [], log
