"""``reorg dashboard --port PORT [--host H] [--token T]``: serve the web page
until Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import socket
from typing import Annotated

import typer

from cli.context import cli_state
from cli.errors import BAD_INPUT, CliFailure

app = typer.Typer()


@app.command()
def dashboard(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(
        envvar="REORG_DASHBOARD_PORT", min=1, max=65535, show_default=False,
        help="TCP port to serve the page on.")],
    host: Annotated[str, typer.Option(
        envvar="REORG_DASHBOARD_HOST",
        help="Address to listen on; 0.0.0.0 for every interface.")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option(
        envvar="REORG_DASHBOARD_TOKEN", show_default=False,
        help="Token the page asks for to pause, resume, cancel, retry or alter jobs (prefer the "
             "environment variable: options show in `ps`). Without it the page is read-only.")
    ] = None,
) -> None:
    """A live web page of jobs, their parameters, rows/s, events and subtasks, and
    the nodes; a read-only JSON API under /api/."""
    state = cli_state(ctx)
    db = state.database()  # fails here, before listening, if unreachable or behind
    listener = _listen(host, port)
    # The web stack loads only for this command, not for every `reorg` command.
    import uvicorn

    from cli.dashboard.actions import Token
    from cli.dashboard.app import create_app
    from framework.db import describe_url

    app_ = create_app(db, token=Token(token or None),
                      database_label=describe_url(state.settings().database_url))
    mode = "read-only" if not token else "pause/resume/cancel/retry/alter need the token"
    where = f"[{host}]" if ":" in host else host
    print(f"reorg dashboard at http://{where}:{port}/ ({mode}); Ctrl-C stops it", flush=True)
    server = uvicorn.Server(uvicorn.Config(app_, log_level="warning", access_log=False,
                                           lifespan="off"))
    # uvicorn shuts down on SIGINT, then raises it again for the caller:
    # stopping the page with Ctrl-C is how it ends, not an error.
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[listener])


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the server starts, so a taken port
    or an unknown host is one clear error line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise CliFailure(f"cannot listen on --host {host}: {exc.strerror}", BAD_INPUT) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise CliFailure(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port "
                         "or --host", BAD_INPUT) from None
    return sock
