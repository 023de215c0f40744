"""Running charts: performing what the pure core plans.

Today this holds :mod:`statifier.session.trace`, a synchronous driver on a virtual
clock used by ``statifier trace`` and by tests.
"""
