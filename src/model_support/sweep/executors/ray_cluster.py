"""Joining a Ray cluster: its address asked before anything runs, the driver's authentication
matched to the cluster's, and the address kept with the sweep so that a plain ``--resume`` joins the
same cluster.

Why a module of its own: ``ray.init``, given an address, retries for tens of seconds before it
fails, and says why only in Ray's own log lines. Nothing answering, a server that is not Ray's (22
s), a cluster that wants a token the driver lacks (``InvalidAuthToken``, 17 to 20 s) all ended in
"Could not start or join the Ray cluster". Asked first, each is one sentence naming the fix, in
milliseconds (a server that never answers: ``CONNECT_S``):

- ``unreachable``: a plain TCP connection (refused, no route, no answer).
- ``gcs_answer``: the first question a driver asks a cluster's head
  (``NodeInfoGcsService/GetClusterId``, gRPC), without a token. Answered: the cluster has token
  authentication off. Refused as Unauthenticated: on, and asked again with the driver's token
  (``driver_token``: ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH``, else
  ``~/.ray/auth_token``, as Ray reads them). Anything else: no Ray head listens there.
- The driver joins in the cluster's mode (``use_auth``). A driver with token authentication on
  joining a cluster with it off sends a token nobody asks for, and refuses every call the cluster's
  nodes make back to it, since they send none: each result the driver had to fetch from another
  node's object store never came (``OwnerDiedError``), was run again, never came again, and its
  model was left pending. That is how the two-node test lost tiny-opt's row in CI: Ray 2.60 turns
  token authentication on for any process that starts a local Ray (``RAY_AUTH_MODE=token`` written
  into its environment, kept after ``ray.shutdown``), and the test process had run a sweep on a
  local Ray before it joined the cluster. So a driver joins a cluster without authentication with
  ``RAY_AUTH_MODE=disabled``, and every join or local Ray puts the driver's own mode back when it
  lets go (``put_back_auth``). A cluster with authentication on and a driver without its token (or
  with it, but its mode not ``token``) is refused in one sentence saying which to set.
- The address is kept in the sweep's folder (``ray.json``: ``remember``), so ``--resume`` without
  ``RAY_ADDRESS`` joins the cluster the sweep ran on, or starts a local Ray where it ran on one
  (``address_to_join``): never a local Ray in place of a cluster; a sweep that never said where it
  ran is refused in one sentence.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
from pathlib import Path

from ... import fileio
from ...errors import UserError

#: Seconds a cluster's address gets to accept a connection, and its head to answer, before the sweep
#: is refused.
CONNECT_S = 5.0
#: The gRPC method a driver first calls on a cluster's head (its GCS): a request and an answer of no
#: arguments.
GCS_QUESTION = "/ray.rpc.NodeInfoGcsService/GetClusterId"
#: Ray's switch for token authentication, and where it finds the token.
AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
#: The file in a sweep's folder that says which Ray it ran on (``remember``).
RECORD = "ray.json"
#: What a refusal for ``RAY_ADDRESS`` proposes.
FIX = "start it (`ray start --head`), fix RAY_ADDRESS, or run with --executor local"


def unreachable(address: str) -> str | None:
    """Why nothing answers at the Ray cluster address ``address`` (``host:port`` or
    ``ray://host:port``), when a plain connection already says so: ``ray.init`` would wait on it,
    retrying, before it failed. None when something answers, or for an address that names no port
    (``auto``: Ray finds its own)."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit() or not host:
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_S).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def gcs_target(address: str) -> str | None:
    """The ``host:port`` of a cluster's head that ``gcs_answer`` asks; None where Ray answers
    otherwise (``ray://``: the Ray Client's server) or finds the head itself (``auto``,
    ``local``)."""
    if address.startswith("ray://"):
        return None
    host, colon, port = address.rpartition(":")
    return address if colon and port.isdigit() and host else None


def gcs_answer(target: str, token: str | None = None) -> tuple[str, str]:
    """How the head at ``target`` answers a driver's first question (with ``token``, when given):
    ("OK", "") or gRPC's status name and its details ("UNAUTHENTICATED", "InvalidAuthToken:
    ..."), within ``CONNECT_S``."""
    try:
        import grpc
    # a Ray without gRPC's Python side: nothing to ask with, ray.init says what it finds
    except ImportError:
        return "OK", ""
    channel = grpc.insecure_channel(target)
    try:
        # bytes in, bytes out: an empty request needs no message class
        ask = channel.unary_unary(GCS_QUESTION)
        ask(
            b"",
            timeout=CONNECT_S,
            metadata=[("authorization", f"Bearer {token}")] if token else None,
        )
        return "OK", ""
    except grpc.RpcError as exc:
        return exc.code().name, (exc.details() or "").strip()
    finally:
        channel.close()


def driver_token() -> tuple[str | None, str]:
    """The token this driver's Ray would send, and where it is from, read as Ray reads it:
    ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else ``~/.ray/auth_token``;
    (None, "") where there is none."""
    if os.environ.get(TOKEN_VAR):
        return os.environ[TOKEN_VAR].strip(), TOKEN_VAR
    path = Path(os.environ.get(TOKEN_PATH_VAR) or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip() or None, str(path)
    except OSError:
        return None, ""


def check_ray_address(
    address: str | None = None, named: str | None = None, fix: str = FIX
) -> str | None:
    """Refuse, in one sentence with its fix, a cluster address (default ``RAY_ADDRESS``) the
    driver cannot join: nothing answers, no Ray head answers, or the head wants a token this
    driver does not send. ``named``: how the sentence names the address (default
    ``RAY_ADDRESS=...``). Returns the cluster's authentication, "disabled" or "token"; None where
    nothing was asked (no address, ``ray://``, ``auto``)."""
    address = address if address is not None else os.environ.get("RAY_ADDRESS")
    if not address:
        return None
    named = named or f"RAY_ADDRESS={address}"
    why = unreachable(address)
    if why:
        raise UserError(f"Could not join the Ray cluster at {named} ({why}); {fix}.")
    target = gcs_target(address)
    if target is None:
        return None
    code, details = gcs_answer(target)
    if code == "OK":
        return "disabled"
    if code != "UNAUTHENTICATED":
        heard = (
            f"no Ray answer within {CONNECT_S:g} s"
            if code == "DEADLINE_EXCEEDED"
            else f"{code}: {details}"
        )
        raise UserError(
            f"{named} answers, but no Ray cluster's head does there "
            f"({heard.splitlines()[0][:200]}); point it at the head's address (the --port of "
            "`ray start --head`, 6379 by default), or run with --executor local."
        )
    token, source = driver_token()
    mode = os.environ.get(AUTH_MODE)
    if token and gcs_answer(target, token)[0] == "OK":
        if mode == "token":
            return "token"
        raise UserError(
            f"The Ray cluster at {named} has token authentication on and this driver does not "
            f"use it ({AUTH_MODE}={mode or 'unset'}; its token, from {source}, is the "
            f"cluster's); set {AUTH_MODE}=token."
        )
    which = "not the cluster's" if token else "missing"
    raise UserError(
        f"The Ray cluster at {named} has token authentication on and this driver's token is "
        f"{which} (InvalidAuthToken); set {AUTH_MODE}=token and {TOKEN_VAR} to the head's "
        "token (`ray get-auth-token` on the head prints it), or start the cluster with "
        f"{AUTH_MODE}=disabled on a private network."
    )


def _refresh_ray_config() -> None:
    """Ray reads ``RAY_AUTH_MODE`` and the token once and keeps them: read them again, as Ray
    itself does after it changes the mode (``authentication_token_setup``)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # not in its stub
    except ImportError:  # a Ray without token authentication: nothing kept
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def use_auth(cluster: str | None) -> str | None:
    """Before the driver joins (or starts a local Ray): the driver's Ray in the cluster's
    authentication mode (``cluster``: "disabled", "token", or None to leave it as it is); returns
    the driver's own mode (None: unset), for ``put_back_auth`` once it lets go."""
    before = os.environ.get(AUTH_MODE)
    if cluster is not None:
        os.environ[AUTH_MODE] = cluster
    _refresh_ray_config()
    return before


def put_back_auth(before: str | None) -> None:
    """After ``ray.shutdown``: the driver's own authentication mode again (a local Ray of Ray
    2.60 wrote "token")."""
    if before is None:
        os.environ.pop(AUTH_MODE, None)
    else:
        os.environ[AUTH_MODE] = before
    _refresh_ray_config()


def remember(sweep_dir: Path | None, address: str | None) -> None:
    """Keep in the sweep's folder which Ray it runs on: a cluster's address, or None for a local
    Ray it started."""
    if sweep_dir is not None and sweep_dir.is_dir():
        now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        fileio.atomic_write_json(sweep_dir / RECORD, {"address": address, "joined_at": now})


def recorded(sweep_dir: Path) -> dict | None:
    """What ``remember`` kept ({"address": ..., "joined_at": ...}); None where the sweep never
    joined a Ray."""
    try:
        kept = json.loads((sweep_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def inherit(parent_dir: Path, child_dir: Path) -> None:
    """A sweep made from another (``ops --prove``'s what-if sweeps) runs on the Ray its parent
    ran on: the parent's ``ray.json`` copied into the child's folder, so that ``address_to_join``
    joins that cluster (or a new local Ray where the parent ran on one) without ``RAY_ADDRESS``;
    a parent that never said where it ran leaves nothing, and the child is refused as the
    parent's resume would be."""
    kept = recorded(parent_dir)
    if kept is not None and child_dir.is_dir():
        fileio.atomic_write_json(child_dir / RECORD, kept)


def address_to_join(sweep_dir: Path, sweep_id: str, resumed: bool) -> str | None:
    """The cluster a Ray run of sweep ``sweep_id`` joins: ``RAY_ADDRESS`` when set; else, for a
    sweep resumed on the executor it was started with (``resumed``), the one it ran on
    (``recorded``; None where that was a local Ray), checked there and said on stderr; else None
    (a local Ray). A resumed sweep that never said where it ran is refused in one sentence: a
    local Ray in place of its cluster would run it elsewhere, silently."""
    address = os.environ.get("RAY_ADDRESS") or None
    if address or not resumed:
        return address
    kept = recorded(sweep_dir)
    if kept is None:
        raise UserError(
            f"Sweep {sweep_id} runs on Ray, RAY_ADDRESS is not set and the sweep never said "
            "which cluster it ran on; set RAY_ADDRESS to its cluster's address, or resume it "
            "with --executor local."
        )
    address = kept.get("address") or None
    if address:
        check_ray_address(
            address,
            named=f"{address}, where sweep {sweep_id} ran",
            fix="start it, set RAY_ADDRESS to the cluster that runs it now, or resume it with "
            "--executor local",
        )
        print(
            f"Sweep {sweep_id} ran on the Ray cluster at {address}: resuming it there.",
            file=sys.stderr,
        )
    return address
