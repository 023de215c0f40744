"""Running charts: performing what the pure core plans.

- :mod:`statifier.session.live`: asyncio sessions (:class:`~statifier.session.live.System`,
  :class:`~statifier.session.live.Session`) that perform sends, timers and invocations.
- :mod:`statifier.session.clock`: the real clock and a virtual one for tests.
- :mod:`statifier.session.trace`: a synchronous virtual-clock driver for
  ``statifier trace``.
"""
