"""Running charts: performing what the pure core plans.

- :mod:`statifier.session.live`: asyncio sessions (:class:`~statifier.session.live.System`,
  :class:`~statifier.session.live.Session`) that perform sends, timers and invocations.
- :mod:`statifier.session.clock`: the real clock and a virtual one for tests.
- :mod:`statifier.session.handlers`: the seams for host send and invoke types.
- :mod:`statifier.session.basichttp`: the BasicHTTP Event I/O Processor.
- :mod:`statifier.session.children`: the chart and datamodel an ``<invoke type="scxml">``
  starts (shared with the durable ``Driver``).
- :mod:`statifier.session.recording`: recording a session's inputs and replaying them.
- :mod:`statifier.session.trace`: the virtual-clock run behind ``statifier trace``.
"""
