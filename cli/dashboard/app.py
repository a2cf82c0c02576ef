"""The dashboard's Starlette application.

Pages are rendered on the server; each live part of a page is a fragment that
htmx fetches again every second (``hx-trigger="every 1s"``; the rows/s chart
every few) and swaps in place, so the page never reloads. Actions are POSTs
carrying the token in their form body. ``/api/`` answers the same reads as
JSON, with the fields of ``reorg status --json`` and ``reorg nodes --json``
(built by the same functions); it changes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from cli.dashboard import actions, chart, reads
from cli.output import count, json_text, rate, table_name
from cli.progress import status_for_json, step_label
from framework import control
from framework.db import Database, DatabaseUnreachable
from framework.durations import duration
from framework.errors import InvalidParams, one_line
from framework.keys import decode, shown
from framework.states import JOB_CANCELLABLE, JobState

HERE = Path(__file__).parent
POLL = "every 1s"
# The chart reads every subtask's span of the job: not every second.
CHART_POLL = "every 5s"
API_JOBS_LIMIT = 1000


def breakable(name: str) -> Markup:
    """``name`` (escaped) with a line-break opportunity after each ``.`` and
    ``_``: a long table name wraps between its words, not within them, and
    no table is wider than the page."""
    return Markup("".join(f"{escape(c)}<wbr>" if c in "._" else str(escape(c)) for c in name))


class _Site:
    """The pages, fragments, actions and JSON of one dashboard over ``db``."""

    def __init__(self, db: Database, token: actions.Token, database_label: str) -> None:
        self.db, self.token, self.database_label = db, token, database_label
        self.templates = Jinja2Templates(directory=HERE / "templates")
        self.templates.env.filters.update(count=count, rate=rate, duration=duration,
                                          key=lambda v: shown(decode(v)),
                                          table_name=lambda v: breakable(table_name(v)),
                                          one_line=one_line, step_label=step_label,
                                          params_shown=reads.params_shown)

    def render(self, request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        return self.templates.TemplateResponse(request, name, {
            "read_only": self.token.read_only, "database": self.database_label, "poll": POLL,
            "chart_poll": CHART_POLL, "alter_fields": actions.ALTER_FIELDS,
            "now": datetime.now(UTC).strftime("%H:%M:%S UTC"), **context,
        }, status_code=status_code)

    def message(self, request: Request, text: str, status_code: int) -> Response:
        """A one-line answer: the fragment htmx swaps in, a page of its own
        for a browser that asked for the page itself, or JSON under /api/."""
        if request.url.path.startswith("/api/"):
            return self.json_response({"error": text}, status_code)
        page = "message.html" if request.headers.get("HX-Request") else "error.html"
        return self.render(request, page, status_code, text=text, ok=status_code < 400)

    def job_or_404(self, job_id: int) -> dict[str, Any]:
        try:
            return reads.job(self.db, job_id)
        except InvalidParams as exc:
            raise HTTPException(404, str(exc)) from None

    def index(self, request: Request) -> Response:
        return self.render(request, "index.html", jobs=reads.jobs(self.db), nodes=reads.nodes(self.db))

    def jobs_fragment(self, request: Request) -> Response:
        return self.render(request, "jobs_table.html", jobs=reads.jobs(self.db))

    def nodes_fragment(self, request: Request) -> Response:
        return self.render(request, "nodes_table.html", nodes=reads.nodes(self.db))

    def subtask_query(self, request: Request, job_id: int) -> dict[str, Any]:
        try:
            after = reads.parse_after(request.query_params.get("after"))
            state = reads.parse_state(request.query_params.get("state"))
        except InvalidParams as exc:
            raise HTTPException(400, str(exc)) from None
        return {"page": reads.subtasks(self.db, job_id, after=after, state=state),
                "query": request.url.query}

    def job_page(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = self.job_or_404(job_id)
        return self.render(request, "job.html", job=job, events=reads.events(self.db, job_id),
                      cancellable=JobState(job["state"]) in JOB_CANCELLABLE,
                      chart=self.rate_chart(job),
                      **self.subtask_query(request, job_id))

    def rate_chart(self, job: dict[str, Any]) -> chart.Chart | None:
        series = reads.throughput(self.db, job["id"])
        return chart.draw(series, job["max_rows_per_sec"]) if series else None

    def chart_fragment(self, request: Request) -> Response:
        job = self.job_or_404(request.path_params["job_id"])
        return self.render(request, "rate_chart.html", chart=self.rate_chart(job))

    def summary_fragment(self, request: Request) -> Response:
        return self.render(request, "job_summary.html", job=self.job_or_404(request.path_params["job_id"]))

    def events_fragment(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        self.job_or_404(job_id)
        return self.render(request, "events_table.html", events=reads.events(self.db, job_id))

    def subtasks_fragment(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = self.job_or_404(job_id)
        return self.render(request, "subtasks_table.html", job=job, **self.subtask_query(request, job_id))

    async def act(self, request: Request) -> Response:
        job_id, name = request.path_params["job_id"], request.path_params["action"]
        if name != "alter" and name not in actions.ACTIONS:
            known = ", ".join([*actions.ACTIONS, "alter"])
            return self.message(request, f"no action {name!r}; one of {known}", 404)
        # The form is urlencoded (htmx's default); parsed here, without a
        # multipart library for a few fields.
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode("utf-8", "replace"),
                                             keep_blank_values=True).items()}
        try:
            self.token.check(form.get("token"))
        except actions.Refused as refused:
            return self.message(request, str(refused), 403)
        who = actions.actor(request.client.host if request.client else None)
        try:
            if name == "alter":
                done = await run_in_threadpool(actions.alter, self.db, job_id, form, who=who)
            else:
                done = await run_in_threadpool(actions.run, self.db, name, job_id, who=who)
        except InvalidParams as exc:
            text = str(exc)
            # The job refused it (its state), or it is not there; else the input.
            status = (404 if "does not exist" in text
                      else 409 if text.startswith(f"job {job_id} ") else 400)
            return self.message(request, text, status)
        return self.message(request, done, 200)

    def json_response(self, value: Any, status_code: int = 200) -> Response:
        return Response(json_text(value), status_code, media_type="application/json")

    def api_jobs(self, request: Request) -> Response:
        raw = request.query_params.get("limit", "20")
        if not raw.isdigit() or not 1 <= int(raw) <= API_JOBS_LIMIT:
            raise HTTPException(400, f"limit={raw!r} is not a number of jobs from 1 to "
                                     f"{API_JOBS_LIMIT}, e.g. limit=20")
        return self.json_response(status_for_json(self.db, None, int(raw)))

    def api_job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            return self.json_response(status_for_json(self.db, job_id, 1)[0])
        except InvalidParams as exc:
            raise HTTPException(404, str(exc)) from None

    def api_nodes(self, request: Request) -> Response:
        return self.json_response(control.nodes(self.db))

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return self.message(request, exc.detail, exc.status_code)

    async def unreachable(self, request: Request, exc: Exception) -> Response:
        return self.message(request, one_line(str(exc), limit=None), 503)

    async def unexpected(self, request: Request, exc: Exception) -> Response:
        return self.message(request, f"unexpected failure: {one_line(str(exc), limit=None)}", 500)


def create_app(db: Database, *, token: actions.Token, database_label: str) -> Starlette:
    """The application over ``db``. ``database_label`` names the database on
    the page; it must hold no credentials (``framework.db.describe_url``)."""
    site = _Site(db, token, database_label)
    job = "/jobs/{job_id:int}"
    return Starlette(
        routes=[
            Route("/", site.index),
            Route("/fragments/jobs", site.jobs_fragment),
            Route("/fragments/nodes", site.nodes_fragment),
            Route(job, site.job_page),
            Route(job + "/fragments/summary", site.summary_fragment),
            Route(job + "/fragments/events", site.events_fragment),
            Route(job + "/fragments/subtasks", site.subtasks_fragment),
            Route(job + "/fragments/chart", site.chart_fragment),
            Route(job + "/{action:str}", site.act, methods=["POST"]),
            Route("/api/jobs", site.api_jobs),
            Route("/api/jobs/{job_id:int}", site.api_job),
            Route("/api/nodes", site.api_nodes),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        exception_handlers={HTTPException: site.http_error,
                            DatabaseUnreachable: site.unreachable,
                            Exception: site.unexpected},
    )
