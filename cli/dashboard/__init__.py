"""``reorg dashboard``: a web page of jobs, their parameters, limits, rows/s
chart, events and subtasks, and the nodes, live without reloading;
pause/resume/cancel/retry/alter behind a token; a read-only JSON API under
``/api/`` with the fields of ``reorg status --json`` and ``nodes --json``.

- ``command``: the typer command (options, the listening socket, uvicorn).
- ``app``: the Starlette application: routes, templates and the API.
- ``reads``: what the pages show, read through ``framework.control`` and
  ``framework.store`` (bounded reads: one page of subtasks at a time, one
  row per bar of the chart).
- ``actions``: the token check and the job actions (those of ``reorg pause``,
  ``resume``, ``cancel``, ``retry`` and ``alter``), each recorded with the
  actor ``dashboard:<client address>``.
- ``chart``: the geometry of the rows/s chart, drawn as inline SVG by a
  template (no script, nothing fetched).
- ``templates/``, ``static/``: Jinja2 templates, the stylesheet, and htmx
  (htmx 2.0.11, 0BSD, vendored from npm's ``htmx.org``; nothing is fetched
  from a CDN).

Only ``command`` imports typer, so the application runs under any ASGI server;
the rest of ``cli`` never imports the web libraries (Starlette, uvicorn,
Jinja2), which load only when the dashboard starts. SQL on the system tables
stays in ``framework.store``.
"""
