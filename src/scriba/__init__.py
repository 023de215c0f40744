"""scriba: projections that keep read models in step with event streams.

scriba is shipped in the ``statifier`` distribution but stands on its own: it
never imports statechart internals (``statifier.chart``, ``statifier.core``,
``statifier.session``). It is planned; this package is empty for now.
"""

__all__: list[str] = []
