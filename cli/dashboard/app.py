"""The dashboard's Starlette application.

Pages are rendered on the server; each live part of a page is a fragment that
htmx fetches again every second (``hx-trigger="every 1s"``) and swaps in
place, so the page never reloads. Actions are POSTs carrying the token in
their form body.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from cli.dashboard import actions, reads
from cli.output import count, duration, rate, table_name
from cli.progress import step_label
from framework.db import Database, DatabaseUnreachable
from framework.errors import InvalidParams, one_line
from framework.keys import decode, shown
from framework.states import JOB_CANCELLABLE, JobState

HERE = Path(__file__).parent
POLL = "every 1s"


def create_app(db: Database, *, token: actions.Token, database_label: str) -> Starlette:
    """The application over ``db``. ``database_label`` names the database on
    the page; it must hold no credentials (``framework.db.describe_url``)."""
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.filters.update(count=count, rate=rate, duration=duration,
                                 key=lambda v: shown(decode(v)), table_name=table_name,
                                 one_line=one_line, step_label=step_label)

    def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(request, name, {
            "read_only": token.read_only, "database": database_label, "poll": POLL,
            "now": datetime.now(UTC).strftime("%H:%M:%S UTC"), **context,
        }, status_code=status_code)

    def message(request: Request, text: str, status_code: int) -> Response:
        """A one-line answer: the fragment htmx swaps in, or a page of its own
        for a browser that asked for the page itself."""
        page = "message.html" if request.headers.get("HX-Request") else "error.html"
        return render(request, page, status_code, text=text, ok=status_code < 400)

    def job_or_404(job_id: int) -> dict[str, Any]:
        try:
            return reads.job(db, job_id)
        except InvalidParams as exc:
            raise HTTPException(404, str(exc)) from None

    def index(request: Request) -> Response:
        return render(request, "index.html", jobs=reads.jobs(db), nodes=reads.nodes(db))

    def jobs_fragment(request: Request) -> Response:
        return render(request, "jobs_table.html", jobs=reads.jobs(db))

    def nodes_fragment(request: Request) -> Response:
        return render(request, "nodes_table.html", nodes=reads.nodes(db))

    def subtask_query(request: Request, job_id: int) -> dict[str, Any]:
        try:
            after = reads.parse_after(request.query_params.get("after"))
            state = reads.parse_state(request.query_params.get("state"))
        except InvalidParams as exc:
            raise HTTPException(400, str(exc)) from None
        return {"page": reads.subtasks(db, job_id, after=after, state=state),
                "query": request.url.query}

    def job_page(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = job_or_404(job_id)
        return render(request, "job.html", job=job, events=reads.events(db, job_id),
                      cancellable=JobState(job["state"]) in JOB_CANCELLABLE,
                      **subtask_query(request, job_id))

    def summary_fragment(request: Request) -> Response:
        return render(request, "job_summary.html", job=job_or_404(request.path_params["job_id"]))

    def events_fragment(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job_or_404(job_id)
        return render(request, "events_table.html", events=reads.events(db, job_id))

    def subtasks_fragment(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = job_or_404(job_id)
        return render(request, "subtasks_table.html", job=job, **subtask_query(request, job_id))

    async def act(request: Request) -> Response:
        job_id, name = request.path_params["job_id"], request.path_params["action"]
        if name not in actions.ACTIONS:
            return message(request, f"no action {name!r}; one of pause, resume, cancel", 404)
        # The form is urlencoded (htmx's default); parsed here, without a
        # multipart library for one field.
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        try:
            token.check(form.get("token", [""])[0])
        except actions.Refused as refused:
            return message(request, str(refused), 403)
        who = actions.actor(request.client.host if request.client else None)
        try:
            state = await run_in_threadpool(actions.run, db, name, job_id, who=who)
        except InvalidParams as exc:
            return message(request, str(exc), 404 if "does not exist" in str(exc) else 409)
        return message(request, f"job {job_id}: {name} requested, now {state}", 200)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return message(request, exc.detail, exc.status_code)

    async def unreachable(request: Request, exc: Exception) -> Response:
        return message(request, one_line(str(exc), limit=None), 503)

    async def unexpected(request: Request, exc: Exception) -> Response:
        return message(request, f"unexpected failure: {one_line(str(exc), limit=None)}", 500)

    job = "/jobs/{job_id:int}"
    return Starlette(
        routes=[
            Route("/", index),
            Route("/fragments/jobs", jobs_fragment),
            Route("/fragments/nodes", nodes_fragment),
            Route(job, job_page),
            Route(job + "/fragments/summary", summary_fragment),
            Route(job + "/fragments/events", events_fragment),
            Route(job + "/fragments/subtasks", subtasks_fragment),
            Route(job + "/{action:str}", act, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        exception_handlers={HTTPException: http_error, DatabaseUnreachable: unreachable,
                            Exception: unexpected},
    )
