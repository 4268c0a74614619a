"""A study's checks: whether the measured direction and rough size agree with what the
paper or first principles expect, judged on the figures and printed as a verdict.

Two kinds, written under ``study.checks``::

    - name: a 15:1 core cuts cross-pod all-to-all to a fraction
      of: {oversubscription.agg: 15}      # a variant: swept keys (``fabric`` for fabrics:)
      to: {oversubscription.agg: 1}       # or ``variant: N`` (from 1, as report.txt numbers
                                          # them), optionally ``policy``; one variant each
      collective: all-to-all              # an op, or {op, algorithm}; default: the only one
      policy: path-pinned                 # default: the only one (a side may name its own)
      size: max                           # a size, max or min; default: the average over
                                          # sizes (nccl-tests' "Avg bus bandwidth")
      ratio: [0.03, 0.5]                  # busbw(of) / busbw(to) at real speed, inclusive

    - name: single-ToR GPUs are cut off when their ToR fails
      of: {nic_ports: 1}
      completes: false                    # the variant's run ended ok (true) or failed
      collective: all-reduce              # optional: only these configurations, each
      size: max                           # measured (true) or not all (false); policy
                                          # too (default: the whole run, all policies)

A completes check asks about one variant, so ``to`` (the ratio's divisor) is refused on it;
with ``collective``, ``size`` or ``policy`` it asks whether the configurations they select
were measured (a fault that stops the run partway leaves those after it without figures),
``size`` taking the check's collective as a ratio check does (the only one the variant
runs, or the one named). Without them it reads how the run ended.

The ratio is taken at real link speed (each variant's busbw over its own emulation scale,
as ``astral compare`` does), so variants emulated at different scales compare. A check
whose figures are missing (a side that failed, a configuration not run) is "unmeasured",
never "agrees".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.collectives.nccl import average_busbw, buffer_bytes
from orchestrator.collectives.plans import COLLECTIVES
from orchestrator.collectives.sizes import format_size, parse_size
from orchestrator.results.summary import ConfigurationResult
from orchestrator.run.experiment import CHECK_KEYS, SIZE_WORDS, ExperimentSpec
from topologies.errors import ExperimentError


class Variant(Protocol):
    """What a check knows of a variant (orchestrator.study.spec.Variant)."""

    @property
    def index(self) -> int: ...

    @property
    def label(self) -> str: ...

    @property
    def settings(self) -> tuple[tuple[str, Any], ...]: ...

    @property
    def spec(self) -> ExperimentSpec: ...

    def setting(self, key: str) -> Any: ...


class VariantFigures(Protocol):
    """What a check reads of a variant's run: how it ended and its configurations."""

    @property
    def status(self) -> str: ...

    @property
    def results(self) -> Sequence[ConfigurationResult]: ...

    @property
    def scale(self) -> float: ...


@dataclass(frozen=True)
class Side:
    """One side of a check: the variant it names and the policy it reads."""

    variant: int  # the variant's index
    policy: str | None  # None: the variant's only policy

    def read(self, variants: Sequence[Variant]) -> str:
        """The policy the side reads: its own, else its variant's only one."""
        return self.policy or variants[self.variant].spec.policies[0]

    def describe(self, variants: Sequence[Variant]) -> str:
        label = variants[self.variant].label
        return f"{label} / {self.policy}" if self.policy else label


@dataclass(frozen=True)
class Verdict:
    """A check's outcome: agrees, disagrees or unmeasured, and the figures behind it."""

    check: str
    outcome: str
    text: str
    measured: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "verdict": self.outcome,
            "text": self.text,
            "measured": self.measured,
        }


@dataclass(frozen=True)
class Check:
    name: str
    of: Side
    to: Side | None = None
    op: str = ""
    algorithm: str | None = None
    size: int | str | None = None  # bytes, "max", "min", or None: the average over sizes
    ratio: tuple[float, float] | None = None
    completes: bool | None = None

    def judge(self, variants: Sequence[Variant], figures: Sequence[VariantFigures]) -> Verdict:
        """The verdict on the study's measured figures (indexed like ``variants``)."""
        if self.completes is not None:
            return self._judge_completes(variants[self.of.variant], figures[self.of.variant])
        assert self.to is not None and self.ratio is not None
        a = self._busbw(self.of, variants, figures)
        b = self._busbw(self.to, variants, figures)
        where = f"{self._metric()}: {self.of.describe(variants)} vs {self.to.describe(variants)}"
        low, high = self.ratio
        if a is None or b is None or b <= 0:
            missing = self.of if a is None else self.to
            return Verdict(
                self.name,
                "unmeasured",
                f"{where}: no figure for {missing.describe(variants)} "
                f"({figures[missing.variant].status})",
            )
        ratio = a / b
        outcome = "agrees" if low <= ratio <= high else "disagrees"
        return Verdict(
            self.name,
            outcome,
            f"{where}: {a:.2f} / {b:.2f} GB/s = {ratio:.3f} (expected {low:g}-{high:g})",
            ratio,
        )

    @property
    def restricted(self) -> bool:
        """Whether a completes check asks about some configurations, not the whole run."""
        return bool(self.op) or self.size is not None or self.of.policy is not None

    def wanted(self, spec: ExperimentSpec) -> list[tuple[str, str, str, int]]:
        """The (policy, op, algorithm, size) a restricted completes check asks about: those
        of the variant's run that its policy, collective and size select."""
        policies = [self.of.policy] if self.of.policy else list(spec.policies)
        found = []
        for c in spec.collectives:
            if self.op and (c.op != self.op or self.algorithm not in (None, c.algorithm)):
                continue
            sizes = spec.step_sizes(c.op)
            if self.size == "max" or self.size == "min":
                sizes = [max(sizes) if self.size == "max" else min(sizes)] if sizes else []
            elif isinstance(self.size, int):
                sizes = [buffer_bytes(c.op, self.size, spec.dtype, spec.ranks)]
            found += [(p, c.op, c.algorithm, size) for p in policies for size in sizes]
        return found

    def _judge_completes(self, variant: Variant, run: VariantFigures) -> Verdict:
        """Whether the run ended ok, or (restricted) its selected configurations were
        all measured: a configuration with no time did not complete."""
        expected = "to complete" if self.completes else "not to complete"
        if not self.restricted:
            done = run.status == "ok"
            what = "completed" if done else f"ended {run.status}"
        else:
            measured = {
                (c.policy, c.collective, c.algorithm, c.size)
                for r in run.results
                if r.measured
                for c in (r.configuration,)
            }
            wanted = self.wanted(variant.spec)
            missing = [w for w in wanted if w not in measured]
            done = not missing
            scope = self._scope()
            what = (
                f"{scope}: all {len(wanted)} configurations measured"
                if done
                else f"{scope}: {len(missing)} of {len(wanted)} configurations not measured "
                f"(the run ended {run.status})"
            )
        outcome = "agrees" if done == self.completes else "disagrees"
        return Verdict(self.name, outcome, f"{variant.label} {what} (expected {expected})")

    def _scope(self) -> str:
        """What a restricted completes check selects, for its verdict's text."""
        parts = [self.op + (f" ({self.algorithm})" if self.algorithm else "")] if self.op else []
        if isinstance(self.size, str):
            parts.append(f"at the {self.size} size")
        elif self.size is not None:
            parts.append(f"at {format_size(self.size)}")
        if self.of.policy:
            parts.append(f"under {self.of.policy}")
        return " ".join(parts)

    def _metric(self) -> str:
        collective = self.op + (f" ({self.algorithm})" if self.algorithm else "")
        if self.size is None:
            size = "average busbw over sizes"
        elif isinstance(self.size, str):
            size = f"busbw at the {self.size} size"
        else:
            size = f"busbw at {format_size(self.size)}"
        return f"{collective} {size}, real speed"

    def _busbw(
        self, side: Side, variants: Sequence[Variant], figures: Sequence[VariantFigures]
    ) -> float | None:
        """The side's real-speed busbw (GB/s), or None where it was not measured."""
        spec = variants[side.variant].spec
        run = figures[side.variant]
        policy = side.policy or spec.policies[0]
        chosen = [
            r
            for r in run.results
            if r.configuration.policy == policy
            and r.configuration.collective == self.op
            and (self.algorithm is None or r.configuration.algorithm == self.algorithm)
            and not math.isnan(r.row.busbw)
        ]
        if not chosen:
            return None
        if self.size is None:
            return average_busbw([r.row for r in chosen]) / run.scale
        sizes = sorted(r.configuration.size for r in chosen)
        if self.size == "max":
            wanted = sizes[-1]
        elif self.size == "min":
            wanted = sizes[0]
        else:
            assert isinstance(self.size, int)
            wanted = buffer_bytes(self.op, self.size, spec.dtype, spec.ranks)
        for result in chosen:
            if result.configuration.size == wanted:
                return result.row.busbw / run.scale
        return None


def parse_checks(value: object, variants: Sequence[Variant], source: str) -> tuple[Check, ...]:
    """Validate ``study.checks`` against the study's variants (see the module docstring)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ExperimentError(source, "study.checks", "a list of checks", value)
    return tuple(
        _check(entry, f"study.checks[{i}]", variants, source) for i, entry in enumerate(value)
    )


def _check(entry: object, key: str, variants: Sequence[Variant], source: str) -> Check:
    def fail(where: str, expected: str, found: object) -> ExperimentError:
        return ExperimentError(source, f"{key}.{where}" if where else key, expected, found)

    if not isinstance(entry, Mapping):
        raise fail("", "a mapping (name, of, to, collective, ratio or completes)", entry)
    for name in entry:
        if name not in CHECK_KEYS:
            known = "one of the known keys " + ", ".join(sorted(CHECK_KEYS))
            raise fail(str(name), known, "unknown key")
    title = entry.get("name")
    if not isinstance(title, str) or not title:
        raise fail("name", "a text saying what the check asks", title)
    if ("ratio" in entry) == ("completes" in entry):
        found = "both" if "ratio" in entry else "neither"
        raise fail("", "either ratio (with to) or completes", found)
    policy = entry.get("policy")
    if "completes" in entry:
        return _completes(entry, title, key, variants, source, fail)
    of = _side(entry.get("of"), policy, f"{key}.of", variants, source)
    if "to" not in entry:
        raise fail("to", "the variant the ratio divides by", None)
    to = _side(entry["to"], policy, f"{key}.to", variants, source)
    if to.variant == of.variant and to.read(variants) == of.read(variants):
        # a ratio of a figure to itself is 1 whatever was measured: it could only agree
        raise fail(
            "to",
            "a variant (or policy) other than of's: a ratio of a variant to itself says nothing",
            f"variant {to.variant + 1} ({variants[to.variant].label}) / {to.read(variants)}",
        )
    low_high = entry["ratio"]
    if (
        not isinstance(low_high, list)
        or len(low_high) != 2
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in low_high)
        or not 0 <= low_high[0] <= low_high[1]
    ):
        raise fail("ratio", "[low, high]: two numbers, 0 <= low <= high", low_high)
    sides = [variants[of.variant], variants[to.variant]]
    op, algorithm = _collective(entry.get("collective"), sides, fail)
    size = _size(entry.get("size"), fail)
    if isinstance(size, int):
        _measured_size(size, op, entry.get("size"), sides, variants, fail)
    return Check(title, of, to, op, algorithm, size, (float(low_high[0]), float(low_high[1])))


def _completes(
    entry: Mapping[str, Any],
    title: str,
    key: str,
    variants: Sequence[Variant],
    source: str,
    fail: Any,
) -> Check:
    """A completes check (the module docstring): ``to`` is refused, as a ratio's divisor
    that nothing would read; ``collective``, ``size`` and ``policy`` select what it asks
    about, each checked as a ratio check's, and must select some configurations."""
    if not isinstance(entry["completes"], bool):
        raise fail("completes", "true or false", entry["completes"])
    if "to" in entry:
        raise fail(
            "to",
            "no to on a completes check (it asks whether one variant's run completed; to is "
            "a ratio's divisor)",
            entry["to"],
        )
    of = _side(entry.get("of"), entry.get("policy"), f"{key}.of", variants, source, False)
    check = Check(title, of, completes=entry["completes"])
    given = [k for k in ("collective", "size", "policy") if k in entry]
    if of.policy is not None and "policy" not in entry:
        given.append("of.policy")
    if given and not variants[of.variant].spec.collectives:
        raise fail(
            given[0],
            "no collective, size or policy on a completes check of a variant with no "
            "collectives (a workload replay): only whether its run ended ok can be asked",
            entry.get(given[0]) if given[0] in entry else of.policy,
        )
    if "collective" in entry or "size" in entry:
        sides = [variants[of.variant]]
        op, algorithm = _collective(entry.get("collective"), sides, fail)
        size = _size(entry.get("size"), fail)
        if isinstance(size, int):
            _measured_size(size, op, entry.get("size"), sides, variants, fail)
        check = Check(title, of, op=op, algorithm=algorithm, size=size, completes=check.completes)
    return check


def _side(
    value: object,
    policy: object,
    key: str,
    variants: Sequence[Variant],
    source: str,
    one_policy: bool = True,
) -> Side:
    """A selector: the one variant whose settings hold every key given (and its policy).
    ``one_policy``: a variant of several policies needs one named (a ratio reads one; a
    completes check without a policy asks about all of them)."""
    if not isinstance(value, Mapping) or not value:
        raise ExperimentError(
            source, key, "a mapping of swept keys (or fabric) to values, optionally policy", value
        )
    wanted = {k: v for k, v in value.items() if k not in ("policy", "variant")}
    policy = value.get("policy", policy)
    axes = {k for k, _ in variants[0].settings}
    for name in wanted:
        if name not in axes:
            raise ExperimentError(
                source, f"{key}.{name}", "a swept key: " + ", ".join(sorted(axes)), name
            )
    matches = [v for v in variants if all(v.setting(k) == x for k, x in wanted.items())]
    if "variant" in value:  # by its number, where its settings are long (a list of faults)
        number = value["variant"]
        if (
            not isinstance(number, int)
            or isinstance(number, bool)
            or not 1 <= number <= len(variants)
        ):
            expected = f"a variant's number from 1 to {len(variants)} (the study runs that many)"
            raise ExperimentError(source, f"{key}.variant", expected, number)
        matches = [v for v in matches if v.index + 1 == number]
    if len(matches) != 1:
        found = ", ".join(v.label for v in matches) or "none"
        listed = "; ".join(f"{v.index + 1}. {v.label}" for v in variants[:8])
        more = f"; ... {len(variants)} in all" if len(variants) > 8 else ""
        raise ExperimentError(
            source,
            key,
            "a selector that names exactly one variant",
            found,
            detail=f"the study runs {listed}{more}",
        )
    variant = matches[0]
    if policy is not None and policy not in variant.spec.policies:
        raise ExperimentError(
            source, f"{key}.policy", "a policy of the variant: " + ", ".join(variant.spec.policies),
            policy,
        )  # fmt: skip
    if one_policy and policy is None and len(variant.spec.policies) > 1:
        raise ExperimentError(source, f"{key}.policy", "a policy (the variant runs several)", None)
    assert policy is None or isinstance(policy, str)
    return Side(variant.index, policy)


def _collective(value: object, sides: Sequence[Variant], fail: Any) -> tuple[str, str | None]:
    """The check's collective: one that both sides' variants run (a study may sweep
    ``collectives``, and a collective one side never ran could only be "unmeasured")."""
    if value is None:
        ran = {(c.op, c.algorithm) for variant in sides for c in variant.spec.collectives}
        if len(ran) != 1:
            raise fail("collective", "a collective (the study runs several)", None)
        only = ran.pop()
        return only[0], only[1]
    op: object
    algorithm: object
    if isinstance(value, Mapping):
        op, algorithm = value.get("op"), value.get("algorithm")
    else:
        op, algorithm = value, None
    for variant in sides:
        ran_by = variant.spec.collectives
        if op not in COLLECTIVES or not any(
            c.op == op and (algorithm is None or c.algorithm == algorithm) for c in ran_by
        ):
            labels = ", ".join(c.label for c in ran_by)
            same = all(v.spec.collectives == ran_by for v in sides)
            runs = "the study runs" if same else f"{_named(variant)} runs"
            raise fail("collective", f"a collective {runs} ({labels})", value)
    assert isinstance(op, str)
    return op, algorithm if isinstance(algorithm, str) else None


def _measured_size(
    size: int,
    op: str,
    value: object,
    sides: Sequence[Variant],
    variants: Sequence[Variant],
    fail: Any,
) -> None:
    """A check's size must be one the sides' variants run (as ``op`` rounds it): any other
    has no figure, and the whole study would run only for its verdict to be "unmeasured"."""
    for variant in sides:
        spec = variant.spec
        if buffer_bytes(op, size, spec.dtype, spec.ranks) in spec.step_sizes(op):
            continue
        runs = ", ".join(format_size(s) for s in spec.sizes.values())
        same = all(v.spec.sizes == spec.sizes for v in variants)
        who = "the study runs" if same else f"{_named(variant)} runs"
        raise fail("size", f"max, min or a size {who} ({runs})", value)


def _named(variant: Variant) -> str:
    return f"variant {variant.index + 1} ({variant.label})"


def _size(value: object, fail: Any) -> int | str | None:
    if value is None or value in SIZE_WORDS:
        return value
    try:
        return parse_size(value)
    except ValueError as err:
        raise fail("size", f"max, min or a size ({err})", value) from None
