"""What a diagnosis lists: the suspects above its threshold, then less likely ones.

Evidence that fits two places (one switch's two egresses, the two ends of a link) scores
both; the one under the threshold is still where the fault may be, and a ranked list that
drops it hides the second place to look. A healthy verdict lists nothing."""

from __future__ import annotations

import json

from orchestrator.diagnosis.model import ALSO_FLOOR, LISTED, THRESHOLD, Diagnosis, Suspect


def suspect(target: str, score: float, fault: str = "lossy", component: str = "link") -> Suspect:
    return Suspect(component, target, fault, score, [f"evidence for {target}"])


def test_a_suspect_under_the_threshold_follows_the_ranked_ones_up_to_the_list_length() -> None:
    diagnosis = Diagnosis(
        [
            suspect("p0a3>p0t1", 0.55),
            suspect("p0a3>p0t0", 0.17),
            suspect("p0a3>c3", 0.16),
            suspect("p0a3>p0t2", 0.155),  # beyond the list's length
            suspect("p0t0>p0a3", 0.10),  # under the floor
        ]
    )
    assert not diagnosis.healthy
    assert [s.target for s in diagnosis.ranked] == ["p0a3>p0t1"]
    assert [s.target for s in diagnosis.listed] == ["p0a3>p0t1", "p0a3>p0t0", "p0a3>c3"]
    assert len(diagnosis.listed) == LISTED and 0.10 < ALSO_FLOOR < THRESHOLD
    text = diagnosis.render()
    assert "1. link p0a3>p0t1: lossy (score 0.55)" in text
    assert f"less likely (scored under {THRESHOLD}):" in text
    assert "2. link p0a3>p0t0: lossy (score 0.17)" in text
    assert "3. link p0a3>c3: lossy (score 0.16)" in text and "p0a3>p0t2" not in text
    data = json.loads(json.dumps(diagnosis.to_dict()))
    assert data["healthy"] is False and data["threshold"] == THRESHOLD
    assert [(s["target"], s["score"]) for s in data["suspects"]] == [
        ("p0a3>p0t1", 0.55),
        ("p0a3>p0t0", 0.17),
        ("p0a3>c3", 0.16),
    ]


def test_a_healthy_verdict_lists_nothing_however_close_its_suspects_came() -> None:
    diagnosis = Diagnosis([suspect("p0a0>p0t0", 0.49), suspect("p0a0>p0t1", 0.3)])
    assert diagnosis.healthy
    assert diagnosis.listed == [] and diagnosis.to_dict()["suspects"] == []
    assert "less likely" not in diagnosis.render()


def test_what_a_ranked_suspect_already_names_is_not_listed_again() -> None:
    """A link by either direction or order, with the same fault, is one place to look; the
    same link with another fault, or a switch, is another."""
    diagnosis = Diagnosis(
        [
            suspect("p0t0-p0a0", 0.8, "down"),
            suspect("p0a0>p0t0", 0.3, "down"),
            suspect("p0t0>p0a0", 0.25, "slow"),
            suspect("p0a0", 0.2, "blackhole", "switch"),
        ]
    )
    assert [s.key() for s in diagnosis.listed] == [
        ("link", "p0t0-p0a0", "down"),
        ("link", "p0t0>p0a0", "slow"),
        ("switch", "p0a0", "blackhole"),
    ]


def test_ranked_suspects_beyond_the_list_length_are_all_shown_and_nothing_else() -> None:
    diagnosis = Diagnosis([suspect(f"p0a{i}>c0", 0.9 - i / 10) for i in range(4)] +
                          [suspect("p0a9>c0", 0.4)])  # fmt: skip
    assert [s.target for s in diagnosis.listed] == [f"p0a{i}>c0" for i in range(4)]
    assert diagnosis.less_likely == []
