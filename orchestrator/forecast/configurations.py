"""Forecasts for an experiment's configurations, in the order a run executes them.

The experiment itself lives above this package (orchestrator/run/experiment.py); what a
forecast needs of a configuration step is :class:`StepLike`, so that ``astral forecast``
and ``astral run`` (which prints the forecast beside each measurement) hand in their steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from orchestrator.collectives.ceilings import configuration_ceiling
from orchestrator.forecast.calibration import ForecastCalibration
from orchestrator.forecast.model import DEFAULT_SALTS, ConfigurationModel
from orchestrator.forecast.report import Forecasted
from orchestrator.results.store import Configuration
from orchestrator.worker.spec import workers_from_description
from topologies.description import FabricDescription
from topologies.model import Link


class CollectiveLike(Protocol):
    @property
    def op(self) -> str: ...

    @property
    def algorithm(self) -> str: ...


class StepLike(Protocol):
    """What a forecast needs of one configuration (run/experiment.ConfigurationStep)."""

    @property
    def index(self) -> int: ...

    @property
    def policy(self) -> str: ...

    @property
    def collective(self) -> CollectiveLike: ...

    @property
    def size(self) -> int: ...

    @property
    def count(self) -> int: ...

    @property
    def dtype(self) -> str: ...

    @property
    def ranks(self) -> int: ...


class Forecaster:
    """Forecasts on one placement of one fabric; routes are shared between sizes."""

    def __init__(
        self,
        description: FabricDescription,
        gpus: Sequence[str],
        *,
        host_ports: str,
        calibration: ForecastCalibration | None = None,
        failed: Iterable[Link] = (),
        salts: int = DEFAULT_SALTS,
        iterations: int = 0,
        warmup: int = 0,
    ) -> None:
        self.description = description
        self.workers = workers_from_description(description, gpus)
        self.model = ConfigurationModel(
            description,
            self.workers,
            calibration,
            host_ports=host_ports,
            failed=frozenset(failed),
            salts=salts,
        )
        self.host_ports = host_ports
        self.iterations = iterations
        self.warmup = warmup
        spec = description.fabric.spec
        self.rail_bandwidth = spec.nic_ports * spec.emulation.emulated(spec.speeds.nic) / 8

    def forecast(self, step: StepLike) -> Forecasted:
        op, algorithm = step.collective.op, step.collective.algorithm
        prediction = self.model.forecast(
            step.policy, op, algorithm, step.size, max(1, self.iterations)
        )
        configuration = Configuration(
            id=step.index + 1,
            policy=step.policy,
            collective=op,
            algorithm=algorithm,
            size=step.size,
            count=step.count,
            dtype=step.dtype,
            ranks=step.ranks,
            iterations=self.iterations,
            warmup=self.warmup,
            host_ports=self.host_ports,
        )
        ceiling = configuration_ceiling(self.workers, op, algorithm, self.rail_bandwidth)
        return Forecasted(configuration, prediction, ceiling)

    def forecast_all(self, steps: Iterable[StepLike]) -> list[Forecasted]:
        return [self.forecast(step) for step in steps]
