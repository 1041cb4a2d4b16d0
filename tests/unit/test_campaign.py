"""BenchCampaign's pure core: cells and their names, and the numbers a campaign reports."""

from __future__ import annotations

import pytest

from accelbench.api.resources import MAX_NAME_LENGTH
from accelbench.campaign.matrix import (
    MAX_CAMPAIGN_NAME_LENGTH,
    MAX_REPEATS,
    Cell,
    MatrixError,
    apply_assignment,
    cells_of,
    expand,
)
from accelbench.campaign.summary import Ownership, ownership_ratio, pareto_front, regression, spread, winner

ACCELERATORS = [
    {"type": "tpu-v5p", "topology": "2x2x1"},
    {"type": "h100", "count": 2},
    {"type": "gaudi3", "count": 1},
]


def test_a_matrix_is_the_product_minus_excludes_plus_includes() -> None:
    axes = {"accelerator": ACCELERATORS, "training.seqLength": [1024, 3072]}
    cells = expand(axes, exclude=[{"accelerator": ACCELERATORS[2], "training.seqLength": 3072}])
    assert len(cells) == 5
    assert cells[0] == {"accelerator": ACCELERATORS[0], "training.seqLength": 1024}
    extra = {"accelerator": {"type": "h200", "count": 1}, "training.seqLength": 1024}
    again = expand(axes, include=[extra, cells[0]])  # an include already in the product is not doubled
    assert len(again) == 7 and again[-1] == extra
    assert expand({}) == [{}]  # no matrix: the template once
    with pytest.raises(MatrixError, match="has no values"):
        expand({"accelerator": []})


def test_a_cells_key_and_name_survive_edits_of_the_matrix() -> None:
    """Adding a value (a Git edit) adds cells; the existing ones keep their names, so nothing that
    finished is run again."""
    before = {c.child_name("study") for c in cells_of("FinetuneJob", {"accelerator": ACCELERATORS[:2]})}
    after = {c.child_name("study") for c in cells_of("FinetuneJob", {"accelerator": ACCELERATORS})}
    assert before < after and len(after - before) == 1
    reordered = {c.child_name("study") for c in cells_of("FinetuneJob", {"accelerator": ACCELERATORS[::-1]})}
    assert reordered == after
    serve = cells_of("InferenceBench", {"accelerator": ACCELERATORS[:1]})[0]
    train = cells_of("FinetuneJob", {"accelerator": ACCELERATORS[:1]})[0]
    assert serve.key != train.key and serve.child_name("x").startswith("x-s")
    repeated = cells_of("FinetuneJob", {"accelerator": ACCELERATORS[:1]}, repeats=3)
    assert [c.child_name("x") for c in repeated] == [
        f"x-t{train.key}",
        f"x-t{train.key}-2",
        f"x-t{train.key}-3",
    ]
    longest = Cell("FinetuneJob", (), MAX_REPEATS - 1).child_name("c" * MAX_CAMPAIGN_NAME_LENGTH)
    assert len(longest) == MAX_NAME_LENGTH  # a child is a run: within a run's name bound


def test_an_assignment_sets_paths_and_replaces_subtrees() -> None:
    template = {"accelerator": {"type": "cpu", "count": 1}, "training": {"seqLength": 128, "maxSteps": 6}}
    spec = apply_assignment(
        template, {"accelerator": {"type": "h100", "count": 2}, "training.seqLength": 3072}
    )
    assert spec == {
        "accelerator": {"type": "h100", "count": 2},
        "training": {"seqLength": 3072, "maxSteps": 6},
    }
    assert template["training"]["seqLength"] == 128  # the template is not changed
    assert apply_assignment(template, {"pricing.source": "spot"})["pricing"] == {"source": "spot"}
    with pytest.raises(MatrixError, match="not an object"):
        apply_assignment(template, {"training.seqLength.x": 1})


def test_total_cost_of_ownership_reproduces_the_public_study() -> None:
    """Fine-tuning Gemma on TPU v5p-8 cost $56.11 against $119.23 on 2xH100; one hour of serving on
    v6e-8 $21.52 against $22.12 on 2xH100: $77.63 against $141.35, 1.82x."""
    tpu = Ownership(training_dollars=56.11, serving_dollars_per_hour=21.52, serving_hours=1)
    gpu = Ownership(training_dollars=119.23, serving_dollars_per_hour=22.12, serving_hours=1)
    assert (round(tpu.dollars, 2), round(gpu.dollars, 2)) == (77.63, 141.35)
    assert round(ownership_ratio(tpu, gpu), 2) == 1.82
    # The serving hours decide how much the training gap still matters.
    later = [Ownership(t.training_dollars, t.serving_dollars_per_hour, 1000) for t in (tpu, gpu)]
    assert round(ownership_ratio(*later), 3) == round((119.23 + 22120) / (56.11 + 21520), 3)


def test_repeats_give_median_and_spread() -> None:
    s = spread([100.0, 110.0, 90.0])
    assert s is not None and s.median == 100.0 and s.n == 3 and s.cv == pytest.approx(0.1)
    one = spread([5.0])
    assert one is not None and one.cv is None
    assert spread([]) is None


def test_pareto_front_and_winners() -> None:
    points = {
        "tpu": (56.11, 4000.0),
        "h100": (119.23, 4500.0),
        "gaudi": (130.0, 3000.0),
        "h200": (119.23, 4400.0),
    }
    assert pareto_front(points) == ["tpu", "h100"]  # gaudi is beaten on both; h200 by h100 at equal cost
    assert winner({"tpu": 4000.0, "h100": 4500.0, "x": None}, higher_is_better=True) == "h100"
    assert winner({"tpu": 56.11, "h100": 119.23}, higher_is_better=False) == "tpu"
    assert winner({"a": None}, higher_is_better=True) is None


def test_regression_against_a_baseline() -> None:
    assert regression(89.0, 100.0, 0.1, higher_is_better=True)
    assert not regression(91.0, 100.0, 0.1, higher_is_better=True)
    assert regression(1.2, 1.0, 0.1, higher_is_better=False)  # $/1M tokens up 20%
    assert not regression(None, 1.0, 0.1, higher_is_better=False)


# --- budget and concurrency ---------------------------------------------------------------------


def test_cells_start_in_order_until_a_cap_holds_the_rest_with_the_reason() -> None:
    from accelbench.campaign.budget import Candidate, Limits, admit

    cells = [Candidate(f"c{i}", "h100" if i % 2 else "tpu-v5p", 2, 20.0, 1.0) for i in range(6)]
    out = admit(cells, [], Limits(max_concurrent=3, max_per_accelerator=2))
    assert [name for name, _ in out.admitted] == ["c0", "c1", "c2"]
    assert "(maxConcurrent 3)" in out.held["c3"] and all(deadline is None for _, deadline in out.admitted)
    out = admit(cells, [], Limits(max_per_accelerator=1))
    assert [name for name, _ in out.admitted] == ["c0", "c1"]
    assert "run or start on tpu-v5p" in out.held["c2"]


def test_the_budget_admits_what_fits_with_headroom_and_gives_each_a_deadline() -> None:
    from accelbench.campaign.budget import Candidate, Limits, Started, admit

    cells = [Candidate(f"c{i}", "h100", 2, 20.0, 1.0) for i in range(4)]  # $20 projected each
    out = admit(cells, [], Limits(max_usd=70))
    # c0 and c1 get $30 each (the projection + 50 %); c2 only $10 left < $20 projected: held.
    assert out.admitted == [("c0", 5400), ("c1", 5400)]
    assert "past maxUSD 70" in out.held["c2"]
    # Finished cells count what they cost: c0 cost $15, so $25 is free again for c2.
    started = [Started("c0", "h100", 15.0, 30.0, finished=True), Started("c1", "h100", 5.0, 30.0)]
    out = admit(cells[2:], started, Limits(max_usd=70))
    assert out.admitted == [("c2", 4500)]  # $25 at $20/h
    chips = admit(cells, [], Limits(max_chip_hours=4))
    assert [n for n, _ in chips.admitted] == ["c0"] and "maxChipHours 4" in chips.held["c1"]


def test_a_campaign_never_spends_past_its_budget_whatever_the_runs_take() -> None:
    """Simulated: cells whose real durations are 0.2x to 4x their projections, admitted as the
    operator would and stopped at their deadlines; the spend never passes maxUSD."""
    import random

    from accelbench.campaign.budget import Candidate, Limits, Started, admit

    for seed in range(200):
        rng = random.Random(seed)
        limits = Limits(max_usd=rng.uniform(20, 400), max_concurrent=rng.randint(1, 4))
        pending = [
            Candidate(
                f"c{i}",
                rng.choice(["h100", "tpu"]),
                rng.randint(1, 8),
                rng.uniform(2, 40),
                rng.uniform(0.1, 3),
            )
            for i in range(rng.randint(1, 15))
        ]
        truth = {c.name: c.projected_hours * rng.uniform(0.2, 4.0) for c in pending}
        started: dict[str, Started] = {}
        ends: dict[str, tuple[float, float]] = {}  # name -> (when it ends, what it costs)
        clock = 0.0
        while True:
            out = admit(pending, list(started.values()), limits)
            for name, deadline in out.admitted:
                cell = next(c for c in pending if c.name == name)
                assert deadline is not None
                hours = min(truth[name], deadline / 3600)  # stopped at its deadline
                ends[name] = (clock + hours, cell.dollars_per_hour * hours)
                started[name] = Started(name, cell.accelerator, 0.0, cell.dollars_per_hour * deadline / 3600)
                pending.remove(cell)
            running = [n for n in ends if not started[n].finished]
            if not running:
                break  # done, or the rest is held by the budget: the campaign stalls there
            name = min(running, key=lambda n: ends[n][0])
            clock, cost = ends[name]
            started[name] = Started(
                name, started[name].accelerator, cost, started[name].allowed_dollars, finished=True
            )
        spent = sum(s.spent_dollars for s in started.values())
        assert spent <= limits.max_usd + 1e-6, (seed, spent, limits.max_usd)
