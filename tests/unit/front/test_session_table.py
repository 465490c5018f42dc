"""The session table on its own: each session in one state, and the client id's owner, through each transition."""

from __future__ import annotations

import socket

from service.front.sessions import ClientSession, SessionState, SessionTable


def session(identity: bytes, token: bytes) -> ClientSession:
    return ClientSession(identity, 0, 100, "test", 0, token)


def test_a_session_awaits_its_handshake_then_is_attached_with_its_own_client_id() -> None:
    table = SessionTable()
    a, b = session(b"a", b"ta"), session(b"b", b"tb")
    table.open(a)
    table.open(b)
    assert (a.client_id, b.client_id) == (1, 2) and a.state is SessionState.AWAITING_HANDSHAKE
    assert table.get(b"a") is a and table.owner(1) is a and table.awaiting_handshake() == 2
    assert table.take_token(b"ta") is a and table.take_token(b"ta") is None  # a token is good once
    with socket.socket(socket.AF_UNIX) as conn:
        assert table.attach(a, conn) is None
        assert a.state is SessionState.ATTACHED and a.attached and table.attached() == [a]
    assert table.awaiting_handshake() == 1 and len(table) == 2 and list(table) == [a, b]


def test_an_ended_session_is_gone_and_owns_nothing() -> None:
    table = SessionTable()
    a = session(b"a", b"ta")
    table.open(a)
    assert table.end(a) is True
    assert a.state is SessionState.ENDED and not table.is_live(a) and table.owner(a.client_id) is None
    assert table.take_token(b"ta") is None and len(table) == 0


def test_a_kept_session_still_owns_its_client_id_until_it_is_forgotten() -> None:
    table = SessionTable()
    a = session(b"a", b"ta")
    table.open(a)
    with socket.socket(socket.AF_UNIX) as conn:
        assert table.take_token(b"ta") is a
        table.attach(a, conn)
        assert table.end(a, keep=True) is True
        assert a.state is SessionState.KEPT and not table.is_live(a)
        assert table.owner(a.client_id) is a and table.kept() == [a] and table.kept_session(a.client_id) is a
        assert table.attached() == [a]  # its memory connection tells when its process is gone
        table.forget(a)
        assert a.state is SessionState.ENDED and table.owner(a.client_id) is None and table.kept() == []


def test_only_an_attached_session_is_kept() -> None:
    table = SessionTable()
    a = session(b"a", b"ta")
    table.open(a)
    assert table.end(a, keep=True) is True
    assert a.state is SessionState.ENDED and table.kept() == []


def test_a_claim_owns_nothing_until_its_handshake_proves_it() -> None:
    table = SessionTable()
    kept = session(b"old", b"t1")
    table.open(kept)
    with socket.socket(socket.AF_UNIX) as old_conn, socket.socket(socket.AF_UNIX) as new_conn:
        table.attach(kept, old_conn)
        table.end(kept, keep=True)
        claim = session(b"new", b"t2")
        table.open(claim, claimed=kept.client_id)
        assert claim.state is SessionState.CLAIMING and claim.client_id == kept.client_id
        assert table.owner(kept.client_id) is kept  # reports still go to the kept session
        # A claim that ends unproven leaves the kept session as it was.
        assert table.end(claim) is False
        assert table.owner(kept.client_id) is kept and kept.state is SessionState.KEPT
        claim = session(b"new", b"t3")
        table.open(claim, claimed=kept.client_id)
        assert table.attach(claim, new_conn) is kept
        assert claim.state is SessionState.ATTACHED and kept.state is SessionState.ENDED
        assert table.owner(kept.client_id) is claim and table.kept() == []
