"""The operator console: executions, routing, failures and projections in a browser.

Served by ``statifier serve`` (a ``[console]`` table) and by
``statifier console --database URL``; see ``docs/console.md``. Its modules:

* :mod:`statifier.console.app` -- the Starlette app: the pages, the confirmation
  forms and the actions (:class:`~statifier.console.app.Console`,
  :func:`~statifier.console.app.console_routes`, :func:`~statifier.console.app.console_app`);
* :mod:`statifier.console.auth` -- operators, their roles, the signed session cookie
  and CSRF;
* :mod:`statifier.console.live` -- the server-sent events that keep pages live;
* :mod:`statifier.console.actions` -- what the action buttons do, through the
  library's own calls;
* :mod:`statifier.console.queries` and :mod:`statifier.console.audit` -- what the
  pages read, and the audit trail of every action;
* :mod:`statifier.console.diagram` and :mod:`statifier.console.replay` -- a chart
  drawn as SVG, an input log replayed through the pure core;
* :mod:`statifier.console.timeline` -- each replayed step with its data, its errors
  and the timer and outbox rows its sends made;
* :mod:`statifier.console.standalone` -- ``statifier console``.

Importing the package imports nothing else: the app needs the ``console`` extra
(Starlette and Jinja2), the reads the SQL layer.
"""
