"""What-ifs on the command line, shared by ``astral forecast`` of an experiment and of a
workload: ``--set KEY=VALUE`` (a key of the experiment or its fabric, dotted; values are
YAML) and ``--fail LINK|SWITCH`` (links taken down)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from topologies.errors import ConfigError

# Experiment keys a forecast does not model, and what to do instead: a what-if of one would
# print a variant equal to the baseline, as if the change made no difference.
UNMODELLED = {
    "faults": "the forecast takes no timed faults; --fail LINK|SWITCH takes one down",
    "monitor": "the monitor's level changes what a run records, not what the model predicts",
    "load_limit": "the load guard decides whether a run starts, not what it measures",
    "cluster": "the model forecasts the fabric whatever machines would emulate it",
}


def with_settings(
    document: dict[str, Any], settings: Sequence[str], base_dir: Path = Path(".")
) -> dict[str, Any]:
    """``document`` with every ``KEY=VALUE`` applied (a copy; orchestrator.run.overrides
    says which document a key changes); a key of :data:`UNMODELLED` is an error."""
    from orchestrator.run.overrides import changed

    pairs: list[tuple[str, object]] = []
    for setting in settings:
        key, sep, text = setting.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("--set", setting, "KEY=VALUE, e.g. speeds.nic=400G", setting)
        head = key.split(".", 1)[0]
        if head in UNMODELLED:
            raise ConfigError(
                "--set",
                key,
                "a key the forecast models (any experiment or fabric key but "
                + ", ".join(sorted(UNMODELLED))
                + ")",
                key,
                detail=UNMODELLED[head],
            )
        try:
            pairs.append((key, yaml.safe_load(text)))
        except yaml.YAMLError as err:
            raise ConfigError("--set", key, "a YAML value", text, detail=str(err)) from None
    return changed(document, pairs, source="--set", base_dir=base_dir)


def parse_failures(fabric: Any, failures: Sequence[str]) -> frozenset[Any]:
    """``a-b`` (a link between two nodes) or a switch name (all its fabric links).

    NVLink is refused rather than taken: the model always carries a server's own traffic
    over its NVLink switch and routes only the fabric's links around failures, so a failed
    NVLink link or switch would leave the variant equal to the baseline, a what-if that
    silently answers another question."""
    from controllers.routing import FABRIC_LINK_KINDS

    found = set()
    for text in failures:
        if text in fabric.switches:
            links = [x for x in fabric.links if text in (x.a, x.b) and x.kind in FABRIC_LINK_KINDS]
            if not links:
                raise ConfigError(
                    "--fail",
                    text,
                    "a switch of the network (ToR, aggregation, core): NVLink switches are"
                    " inside a server, and the model does not fail them",
                    text,
                )
            found.update(links)
            continue
        a, sep, b = text.partition("-")
        matches = [x for x in fabric.links if {x.a, x.b} == {a, b}] if sep else []
        if not matches:
            raise ConfigError(
                "--fail",
                text,
                "a switch name or a link as NODE-NODE (e.g. p0r0t0-p0r0a0) of the fabric",
                text,
            )
        if not any(x.kind in FABRIC_LINK_KINDS for x in matches):
            raise ConfigError(
                "--fail",
                text,
                "a link of the network (NIC-ToR, ToR-agg, agg-core): NVLink links are"
                " inside a server, and the model does not fail them",
                text,
            )
        found.update(matches)
    return frozenset(found)


@contextmanager
def routed_around(failures: Sequence[str]) -> Iterator[None]:
    """Turn a forecast's RoutingError into a ConfigError naming ``failures`` when there are
    some. Why: failures can leave a connection without a route (both NIC ports of a GPU,
    every core, a ToR's every uplink while its hosts still send to it); the collective
    would then never finish, and no figure can be forecast. Without failures a
    RoutingError is a bug in the model, and passes through."""
    from controllers.routing import RoutingError

    try:
        yield
    except RoutingError as err:
        if not failures:
            raise
        raise ConfigError(
            "--fail",
            ", ".join(failures),
            "failures the policy can route every connection around",
            "a connection left without a route",
            detail=str(err),
        ) from None
