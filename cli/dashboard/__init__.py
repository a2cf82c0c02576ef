"""``reorg dashboard``: a web page of jobs, their events and subtasks, and the
nodes, live without reloading; pause/resume/cancel behind a token.

- ``command``: the typer command (options, the listening socket, uvicorn).
- ``app``: the Starlette application: routes and templates.
- ``reads``: what the pages show, read through ``framework.control`` and
  ``framework.store`` (bounded reads: one page of subtasks at a time).
- ``actions``: the token check and the job actions, each recorded with the
  actor ``dashboard:<client address>``.
- ``templates/``, ``static/``: Jinja2 templates, the stylesheet, and htmx
  (htmx 2.0.11, 0BSD, vendored from npm's ``htmx.org``; nothing is fetched
  from a CDN).

Only ``command`` imports typer, so the application runs under any ASGI server;
the rest of ``cli`` never imports the web libraries (Starlette, uvicorn,
Jinja2), which load only when the dashboard starts. SQL on the system tables
stays in ``framework.store``.
"""
