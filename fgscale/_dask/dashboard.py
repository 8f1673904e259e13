"""The dashboard link of a Dask client: found once, printed once per client (on stderr), and
only where a dashboard answers."""

from __future__ import annotations

import logging
import sys
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger("fgscale._dask.client")  # the records of the cluster's module, as before

__all__ = ["dashboard_link", "log_dashboard"]

# Each client's link (None: no dashboard), found and printed once: calls nest (train_run -> fit
# -> bank) and a notebook fits many times on one client, so the link is printed (and a joined
# scheduler's asked for) once per client, not per call.
_LINKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def dashboard_link(client: Client) -> str | None:
    """The client's dashboard URL, or None when the scheduler serves no dashboard.

    For a scheduler in this process, the address its dashboard is bound to: distributed's own
    link names the machine's network address, where the embedded cluster does not listen.
    """
    try:
        link = client.dashboard_link
    except (KeyError, AttributeError):  # dashboard disabled: no "dashboard" service
        return None
    scheduler = getattr(getattr(client, "cluster", None), "scheduler", None)
    sockets = getattr(getattr(scheduler, "http_server", None), "_sockets", None) or {}
    for sock in list(sockets.values()):
        try:
            host, port = sock.getsockname()[:2]
        except OSError:  # closed: the cluster is shutting down
            continue
        if host in ("127.0.0.1", "::1"):
            return f"http://{'[::1]' if host == '::1' else host}:{port}/status"
    return link if sockets or not _not_found(link) else None


def _not_found(link: str) -> bool:
    """Whether a joined scheduler answers 404 at its dashboard link: ``dask scheduler
    --no-dashboard`` still serves its HTTP routes (health, metrics) on the dashboard's port and
    names it among its services. Anything else (no answer, a proxy's refusal) keeps the link."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as a browser there
    try:
        opener.open(urllib.request.Request(link, method="HEAD"), timeout=2).close()
    except urllib.error.HTTPError as exc:
        return exc.code == 404
    except (OSError, ValueError):
        pass
    return False


def log_dashboard(client: Client, what: str) -> None:
    """Log how the client came, and print its dashboard link the first time it comes.

    Printed rather than logged: a user who calls ``fit`` on a store in a notebook sees no INFO
    log, and that link is the only view of a fit that streams for minutes (stderr, so that a
    command's stdout, such as ``fgscale evaluate --json``, stays parseable).
    """
    first = client not in _LINKS
    if first:
        _LINKS[client] = dashboard_link(client)
    link = _LINKS[client]
    log.info("%s; dashboard: %s", what, link or "none")
    if link is not None and first:
        print(f"Dask dashboard: {link}", file=sys.stderr, flush=True)
