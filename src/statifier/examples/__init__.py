"""Example charts shipped with the library (used by ``statifier demo``)."""

from importlib.resources import files

__all__ = ["read"]


def read(name: str) -> bytes:
    """The bytes of a shipped example chart, e.g. ``read("order.scxml")``."""
    return files(__package__).joinpath(name).read_bytes()
