"""``statifier scenario``'s routing cases, run from Python."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statifier.router.scenario import Case, Deployment

__all__ = ["ScenarioRunner"]


@dataclass(frozen=True, slots=True)
class ScenarioRunner:
    """Runs routing cases (the format of ``statifier scenario``) as
    ``statifier scenario CASE --charts DIR`` does, with
    :func:`statifier.router.scenario.run_case`: on a virtual clock, a freshly migrated
    SQLite file of its own per run unless ``database_url`` names one.

    Attributes:
        charts: the directory of ``NAME.scxml`` charts, or a
            :class:`~statifier.router.scenario.Deployment`.
        database_url: where each run migrates and runs (SQLite in a temporary file if
            ``None``).
    """

    charts: Path | Deployment
    database_url: str | None = None

    async def run(self, case: Case | Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
        """Run ``case`` (a :class:`~statifier.router.scenario_case.Case`, its JSON
        object as a mapping, or the path of its file) and answer its report.

        Raises:
            statifier.router.scenario.CaseError: the case is malformed, or a step
                failed (the message names it); as ``run_case``.
        """
        from statifier.router.scenario import run_case

        return await run_case(_case(case), self.charts, self.database_url)

    async def check(
        self,
        case: Case | Mapping[str, Any] | str | os.PathLike[str],
        expected: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run ``case`` and compare its report with ``expected`` (by default the case's
        own ``expected``) as ``statifier scenario`` does; answer the report.

        Raises:
            AssertionError: a key differs; the message has one line per difference
                (:func:`statifier.router.scenario.compare`).
            ValueError: nothing to compare: no ``expected`` given, and the case has none.
            statifier.router.scenario.CaseError: as :meth:`run`.
        """
        from statifier.router.scenario import compare

        loaded = _case(case)
        wanted = expected if expected is not None else loaded.expected
        if wanted is None:
            raise ValueError("nothing to check: the case has no 'expected', and none was given")
        report = await self.run(loaded)
        lines = compare(report, wanted)
        if lines:
            raise AssertionError(
                f"the scenario's report differs in {len(lines)} place"
                f"{'s' if len(lines) != 1 else ''}:\n" + "\n".join(f"  {line}" for line in lines)
            )
        return report


def _case(case: Case | Mapping[str, Any] | str | os.PathLike[str]) -> Case:
    from statifier.router.scenario import Case

    if isinstance(case, Case):
        return case
    if isinstance(case, Mapping):
        return Case.from_mapping(dict(case))
    if isinstance(case, str | os.PathLike):
        return Case.load(Path(case))
    raise TypeError(f"a case is a Case, a mapping or a path, not {case!r}")
