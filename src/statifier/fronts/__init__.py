"""Fronts: what hands events from the outside world to the router.

:mod:`statifier.fronts.source` is the contract of a stream of events; the consumer
runtime reads one and routes its events by key, acknowledging only what committed.
"""
