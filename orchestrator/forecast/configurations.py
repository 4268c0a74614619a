"""Forecasts for an experiment's configurations, in the order a run executes them.

The experiment itself lives above this package (orchestrator/run/experiment.py); what a
forecast needs of a configuration step is :class:`StepLike`, so that ``astral forecast``
and ``astral run`` (which prints the forecast beside each measurement) hand in their steps.

Given a run's bundle (``paths``), the forecast takes the paths its connections took
(orchestrator/forecast/recorded.py) instead of the policy's; a size the bundle ran takes
that configuration's paths, so sizes whose paths differ get a model each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from orchestrator.collectives.ceilings import configuration_ceiling, timed_count
from orchestrator.emulation.recipe import payload_share_of
from orchestrator.forecast.calibration import ForecastCalibration
from orchestrator.forecast.model import DEFAULT_SALTS, ConfigurationModel
from orchestrator.forecast.paths import Routed
from orchestrator.forecast.recorded import Coverage, Key, RecordedPaths
from orchestrator.forecast.report import Forecasted
from orchestrator.results.store import Configuration
from orchestrator.testbed.pinning import Flow, fabric_flows
from orchestrator.worker.spec import LaunchOptions, workers_from_description
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
        paths: Path | None = None,
        min_batch_s: float = 0.0,
        max_iterations: int = LaunchOptions.max_iterations,
    ) -> None:
        self.description = description
        self.workers = workers_from_description(description, gpus)
        self.failed = frozenset(failed)
        self.salts = salts
        self.model = ConfigurationModel(
            description,
            self.workers,
            calibration,
            host_ports=host_ports,
            failed=self.failed,
            salts=salts,
        )
        self.recorded = (
            RecordedPaths.read(paths, description, self.workers, self.failed)
            if paths is not None
            else None
        )
        self._recorded_models: list[tuple[dict[Key, Routed], ConfigurationModel]] = []
        self.host_ports = host_ports
        self.iterations = iterations
        self.warmup = warmup
        # the run's floor on a timed batch's length, which lengthens a short operation's
        # batch (orchestrator.collectives.ceilings.timed_count; 0: ``iterations`` as given)
        self.min_batch_s = min_batch_s
        self.max_iterations = max_iterations
        spec = description.fabric.spec
        self.rail_bandwidth = spec.nic_ports * spec.emulation.emulated(spec.speeds.nic) / 8
        self.payload_share = payload_share_of(description)

    def model_for(self, size: int) -> ConfigurationModel:
        """The model that forecasts ``size``: with the paths recorded for it, if any."""
        if self.recorded is None:
            return self.model
        routes = self.recorded.routes(size)
        for known, model in self._recorded_models:
            if known == routes:
                return model
        model = ConfigurationModel(
            self.description,
            self.workers,
            self.model.calibration,
            host_ports=self.model.host_ports,
            failed=self.failed,
            salts=self.salts,
            recorded=routes,
        )
        self._recorded_models.append((routes, model))
        return model

    def plan(
        self,
        policy: str,
        collective: str,
        algorithm: str,
        ports: Mapping[Flow, int],
        nics: Mapping[Flow, int],
    ) -> int:
        """Forecast ``collective`` under ``policy`` with the source and NIC ports a run
        planned for it before it starts (``Pinning.ports`` and its candidates' ``nic``):
        where the switches hash the five-tuple, those decide every path, and no hash is
        left to draw for the connections they cover (a GPU with two NIC ports takes the
        first candidate port its kernel's seeded hash sends out of the chosen one, which
        a forecast without the run can only draw). Returns how many connections got a
        path so."""
        routed = self.model.router(policy).planned(self.workers, ports, nics)
        if routed.paths:
            self.model.recorded[(policy, collective, algorithm)] = routed
            self.model.forget(policy, collective, algorithm)
        return len(routed.paths)

    def coverage(self, policy: str, collective: str, algorithm: str, size: int) -> Coverage | None:
        """How many of the collective's fabric connections take a recorded path at
        ``size`` (None without a bundle)."""
        if self.recorded is None:
            return None
        channels = self.model.channels_for(collective, algorithm)
        flows = fabric_flows(self.workers, [(collective, algorithm)], channels)[0]
        return self.recorded.coverage((policy, collective, algorithm), size, flows)

    def _timed(self, model: ConfigurationModel, step: StepLike) -> int:
        """The operations the run will time of ``step`` (forecast by ``model``):
        ``iterations``, or more where the warm-up's one operation says the batch would be
        shorter than ``min_batch_s``, as the launcher judges it (without a warm-up it has
        nothing to judge by). A forecast of the batch asked for instead would spread the
        shapers' saved bytes over fewer operations than the run does, and could exceed the
        configuration's ceiling."""
        asked = max(1, self.iterations)
        if not self.min_batch_s or self.warmup < 1:
            return asked
        op, algorithm = step.collective.op, step.collective.algorithm
        one = model.forecast(step.policy, op, algorithm, step.size, 1)
        return timed_count(asked, one.time_us / 1e6, self.min_batch_s, self.max_iterations)

    def forecast(self, step: StepLike) -> Forecasted:
        op, algorithm = step.collective.op, step.collective.algorithm
        model = self.model_for(step.size)
        iterations = self._timed(model, step)
        prediction = model.forecast(step.policy, op, algorithm, step.size, iterations)
        configuration = Configuration(
            id=step.index + 1,
            policy=step.policy,
            collective=op,
            algorithm=algorithm,
            size=step.size,
            count=step.count,
            dtype=step.dtype,
            ranks=step.ranks,
            iterations=iterations,
            warmup=self.warmup,
            host_ports=self.host_ports,
        )
        ceiling = configuration_ceiling(
            self.workers,
            op,
            algorithm,
            self.rail_bandwidth,
            burst_s=self.model.fabric.bucket_s,  # the play-out spends them, as a run does
            payload_share=self.payload_share,
        )
        return Forecasted(configuration, prediction, ceiling)

    def forecast_all(self, steps: Iterable[StepLike]) -> list[Forecasted]:
        return [self.forecast(step) for step in steps]
