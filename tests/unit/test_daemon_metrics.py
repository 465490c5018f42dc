"""The daemon's metrics as a STATS request reads them: the pool, the sessions and the processes."""

from __future__ import annotations

from client_stub.contract import ipc
from service.daemon_metrics import process_metrics
from tests.support.front import BLOCKS, TIMEOUT_MS, Env, notice


def test_stats_report_what_the_pool_holds(env: Env) -> None:
    probe = env.client()
    probe.send(ipc.Stats.TYPE)
    env.pump()
    kind, report = probe.recv()
    assert kind == ipc.StatsReport.TYPE
    assert (report["clients"], report["held"], report["processes"]) == ([], [], [])
    assert {name: report["sidecar"][name] for name in ("blocks-total", "blocks-free", "sessions", "sessions-kept",
                                                      "blocks-granted", "blocks-sealed")} == {
        "blocks-total": BLOCKS, "blocks-free": BLOCKS, "sessions": 0, "sessions-kept": 0, "blocks-granted": 0,
        "blocks-sealed": 0}
    assert report["producer"]["buffer-total-bytes"] == report["producer"]["buffer-available-bytes"]
    a, b, c = env.client(), env.client(), env.client()
    a_id, b_id = a.hello(), b.hello()
    c_id = c.hello(pid=4242, handshake=False)  # no segment yet: it holds nothing, its pid is the HELLO's
    a.blocks(3)
    b.blocks(2, contiguous=True)
    b.publish(notice(batch_id=1, first=0), full=False, wakeup=False)  # a batch open in its segment
    b.send(ipc.Goodbye.TYPE)  # claimed as its session ends: still to be sent, from its segment
    env.pump()
    probe.send(ipc.Stats.TYPE)
    env.pump()
    kind, report = probe.recv()
    assert kind == ipc.StatsReport.TYPE
    assert report["clients"] == [[a_id, env.session(a_id).pid, 3], [c_id, 4242, 0]]
    assert report["held"] == [[a_id, 3], [b_id, 1]]
    sidecar = report["sidecar"]
    assert (sidecar["blocks-free"], sidecar["blocks-granted"], sidecar["blocks-sealed"]) == (BLOCKS - 4, 3, 1)
    assert (sidecar["sessions"], sidecar["clients-connected"], sidecar["records-sealed-total"]) == (2, 1, 1)
    assert report["producer"]["buffer-available-bytes"] == (BLOCKS - 4) * env.pool.block_size
    # One process with a segment: a's (b said goodbye, c has made no memory handshake).
    assert [(p["pid"], p["sessions"], p["blocks-held"]) for p in report["processes"]] == [
        (env.session(a_id).pid, 1, 3)]
    # Asking is no session.
    assert len(env.front.sessions) == 2


def test_a_kept_session_counts_once_for_its_process(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    client.blocks(2)
    env.clock.advance(TIMEOUT_MS + 1)
    env.front.serve_due()  # silent: its session ends, kept (with its segment: the blocks it sealed, none here)
    assert env.sidecar_metrics()["sessions-kept"] == 1
    [process] = process_metrics(env.pool, env.front)
    assert (process["pid"], process["sessions"]) == (env.kept(client_id).pid, 1)
