"""Packaging: one distribution, two typed import packages."""

from importlib import metadata, resources

import scriba
import statifier


def test_version_matches_distribution() -> None:
    assert statifier.__version__ == metadata.version("statifier")


def test_packages_are_typed() -> None:
    for package in (statifier, scriba):
        assert resources.files(package).joinpath("py.typed").is_file(), package.__name__
