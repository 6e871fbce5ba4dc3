"""The connection settings every Cyclone connection carries: keepalives and
``tcp_user_timeout`` from the client option, the user's conninfo winning."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

import cyclone
from cyclone.connections import engine_conninfo, keepalive_params

DSN = "host=db.example port=5433 dbname=app"


def _params(conninfo: str) -> dict[str, Any]:
    return conninfo_to_dict(conninfo)


def test_keepalives_follow_the_user_timeout() -> None:
    assert keepalive_params(10.0) == {
        "keepalives": "1",
        "keepalives_idle": "5",
        "keepalives_interval": "2",
        "keepalives_count": "3",
        "tcp_user_timeout": "10000",
    }
    small = keepalive_params(0.25)  # libpq takes whole seconds: 1 at least
    assert (small["keepalives_idle"], small["keepalives_interval"]) == ("1", "1")
    assert small["tcp_user_timeout"] == "250"
    assert keepalive_params(None) == {}


def test_engine_conninfo_adds_them_and_the_users_values_win() -> None:
    params = _params(engine_conninfo(DSN, schema="public", application_name="cyclone"))
    assert params["tcp_user_timeout"] == "10000" and params["keepalives"] == "1"
    mine = _params(
        engine_conninfo(
            f"{DSN} keepalives_idle=60 tcp_user_timeout=0",
            schema="public",
            application_name="cyclone",
            tcp_user_timeout=2.0,
        )
    )
    assert (mine["keepalives_idle"], mine["tcp_user_timeout"]) == ("60", "0")
    assert mine["keepalives_interval"] == "1"
    none = _params(
        engine_conninfo(DSN, schema="public", application_name="x", tcp_user_timeout=None)
    )
    assert "tcp_user_timeout" not in none and "keepalives" not in none


def test_clients_take_the_option_for_every_connection() -> None:
    client = cyclone.Client(DSN, tcp_user_timeout=timedelta(seconds=3))
    assert client.tcp_user_timeout == 3.0
    assert _params(client._engine_conninfo)["tcp_user_timeout"] == "3000"
    assert _params(client.settings.conninfo_for("cyclone-listen"))["keepalives_count"] == "3"
    sync = cyclone.SyncClient(DSN, tcp_user_timeout=None)
    assert sync.tcp_user_timeout is None
    assert "tcp_user_timeout" not in _params(sync._listen_conninfo)
    assert cyclone.SyncClient(DSN).tcp_user_timeout == 10.0


@pytest.mark.parametrize("bad", [0, -1, "10", float("nan"), 7200])
def test_a_bad_tcp_user_timeout_is_refused(bad: Any) -> None:
    for make in (cyclone.Client, cyclone.SyncClient):
        with pytest.raises(cyclone.ValidationError, match="tcp_user_timeout"):
            make(DSN, tcp_user_timeout=bad)


def test_pooler_values_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad ``pooler=`` or ``$CYCLONE_POOLER`` is refused naming the value."""
    with pytest.raises(cyclone.ValidationError, match="got 'statement'"):
        cyclone.SyncClient("dbname=x", pooler="statement")
    with pytest.raises(cyclone.ValidationError, match="got 'bogus'"):
        cyclone.Client("dbname=x", pooler="bogus")
    monkeypatch.setenv("CYCLONE_POOLER", "sometimes")
    with pytest.raises(cyclone.ValidationError, match=r"\$CYCLONE_POOLER .*'sometimes'"):
        cyclone.Client("dbname=x")
    monkeypatch.setenv("CYCLONE_POOLER", "transaction")
    assert cyclone.Client("dbname=x").settings.pooler == "transaction"
    assert cyclone.SyncClient("dbname=x", pooler="session").settings.pooler == "session"
