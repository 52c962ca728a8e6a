"""Does ranking / search pick the strategies measured fastest? vTrain and Megatron SC21.

vTrain (1,440 measured Megatron-DeepSpeed runs on 1-8 A100s) has many strategies per
(model, GPUs, global batch): for each such group with at least two measured strategies,
``Predictor.rank`` orders the measured strategies and the **top-1 regret** is
``measured(predicted best) / measured(best) - 1``. Printed for both tiers, next to the
regret of picking a strategy at random (the mean over the group) — the floor any model must
beat — and of ranking by the simulator alone (the full tier's base), which the learned
correction starts from. vTrain is in the shipped checkpoint's training data, so these figures
are in-sample; the held-out figures are the evaluation report's ``top1_regret`` (``learnedperf evaluate``).

``search`` over the whole space: for a sample of vTrain groups, the unconstrained search's
best strategy, and whether it is among the measured ones (then its measured regret).

Megatron SC21 Table 1 has one (tuned) strategy per configuration, so regret is undefined;
instead: the rank of the published strategy among the fast tier's predictions for every
strategy of the same family (same tp·pp·dp factorisations, micro-batch 1, 1F1B, full
recompute, as the paper ran), and how much faster search's best is predicted to be.

    python experiments/search_regret.py [--checkpoint DIR] [--groups 40]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

import numpy as np

from learnedperf.measure.public import load_sc21, load_vtrain
from learnedperf.predict import Predictor, enumerate_strategies

from _checkpoint import add_checkpoint_argument, load_predictor, tiers_of


#: vTrain's Megatron-DeepSpeed runs: no fused attention, gradient reduction after the backward
#: (:func:`learnedperf.measure.public.load_vtrain`); the search must not credit them with either
FIXED_VTRAIN = {"flash_attention": False, "overlap_grad_reduce": False}


def _key(run: dict) -> str:
    m, hw, s = run["model"], run["hardware"], run["strategy"]
    return json.dumps([m, hw["num_devices"], s["global_batch_size"]], sort_keys=True)


def vtrain_groups() -> list[list]:
    groups: dict[str, list] = defaultdict(list)
    for r in load_vtrain():
        groups[_key(r.run)].append(r)
    return [g for g in groups.values() if len({json.dumps(r.run["strategy"], sort_keys=True) for r in g}) >= 2]


def rank_regret(predictor: Predictor, groups: list, tier: str) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                      np.ndarray, np.ndarray]:
    """Per group: top-1 regret of ``rank``, the expected regret of a random pick, the P(fastest)
    search would state for the predicted best (:func:`~learnedperf.predict._ranking_confidence`),
    whether the predicted best was the measured best, and the top-1 regret of ranking by the simulator
    alone, the full tier's base (``simulator_iteration_time_ms`` of its predictions: what the learned
    correction starts from, so that a regret can be told apart from the correction's; NaN for the fast
    tier, whose predictions have no simulator time)."""
    from learnedperf.predict import _ranking_confidence

    regret, random_pick, stated, hit, simulator = [], [], [], [], []
    for g in groups:
        run0 = g[0].run
        ranked = predictor.rank(run0["model"], run0["hardware"], [r.run["strategy"] for r in g], tier=tier)
        by_strategy = {json.dumps(r.run["strategy"], sort_keys=True): r.iteration_time_ms for r in g}
        best = min(by_strategy.values())
        top = ranked[0]
        regret.append(by_strategy[json.dumps(top["strategy"], sort_keys=True)] / best - 1)
        random_pick.append(np.mean([t / best - 1 for t in by_strategy.values()]))
        answered = [e for e in ranked if e["rank"] is not None]
        stated.append(_ranking_confidence([e["prediction"] for e in answered])[0][0])
        hit.append(regret[-1] == 0.0)
        with_sim = [e for e in answered if "simulator_iteration_time_ms" in e["prediction"]]
        pick = min(with_sim, key=lambda e: e["prediction"]["simulator_iteration_time_ms"], default=None)
        simulator.append(math.nan if pick is None
                         else by_strategy[json.dumps(pick["strategy"], sort_keys=True)] / best - 1)
    return (np.asarray(regret), np.asarray(random_pick), np.asarray(stated), np.asarray(hit),
            np.asarray(simulator))


def _summary(x: np.ndarray) -> str:
    return (f"mean {100 * x.mean():.2f} %, median {100 * np.median(x):.2f} %, "
            f"<= 5 % in {np.mean(x <= 0.05) * 100:.0f} % of groups")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_argument(ap)
    ap.add_argument("--groups", type=int, default=40, help="vTrain groups searched over the whole space")
    args = ap.parse_args()
    predictor = load_predictor(args.checkpoint, "search_regret")
    groups = vtrain_groups()
    sizes = [len(g) for g in groups]
    print(f"vTrain: {len(groups)} groups (model, GPUs, global batch) with >= 2 measured strategies "
          f"({min(sizes)}-{max(sizes)} strategies, {sum(sizes)} runs); checkpoint {predictor.source} "
          "(vTrain is in its training data: in-sample)")
    for tier in tiers_of(predictor, "search_regret")[::-1]:
        regret, rnd, stated, hit, simulator = rank_regret(predictor, groups, tier)
        print(f"  rank, {tier} tier: top-1 regret {_summary(regret)}; random pick: {_summary(rnd)}")
        # is the stated confidence calibrated? bins of stated P(fastest) against how often the pick was the best
        bins = [(0.0, 0.3), (0.3, 0.6), (0.6, 1.01)]
        parts = [f"stated {lo:.1f}-{min(hi, 1):.1f}: {int(m.sum())} groups, mean stated {stated[m].mean():.2f}, "
                 f"measured best in {hit[m].mean():.2f}" for lo, hi in bins for m in [(stated >= lo) & (stated < hi)]
                 if m.any()]
        print(f"    P(fastest) of the pick: mean stated {stated.mean():.2f}, measured best in {hit.mean():.2f} of "
              f"groups; " + "; ".join(parts))

    # the loop ends with the full tier, whose predictions carry the simulator's time
    print(f"  rank by the simulator alone (the full tier's base): top-1 regret {_summary(simulator)}")

    if predictor.checkpoint.surrogate is None:
        # search screens every candidate with the fast tier, and SC21's ranking below is the fast tier's
        print("  search and the SC21 ranking need the fast tier, which this checkpoint has not: skipped")
        return

    rng = np.random.default_rng(0)
    pick = rng.choice(len(groups), min(args.groups, len(groups)), replace=False)
    found, regrets, gains = 0, [], []
    for i in pick:
        g = groups[int(i)]
        run0 = g[0].run
        s0 = run0["strategy"]
        res = predictor.search(run0["model"], run0["hardware"],
                               {"global_batch_size": s0["global_batch_size"], "precision": s0["precision"],
                                "recompute": ["full"], "zero_stages": [0], "sequence_parallel": [False],
                                "schedules": ["1f1b"], "cp": [1], "fixed": FIXED_VTRAIN}, top=1)
        if not res["results"]:
            continue
        best = res["results"][0]
        measured = {json.dumps({k: r.run["strategy"][k] for k in ("tp", "pp", "dp", "micro_batch_size")},
                               sort_keys=True): r.iteration_time_ms for r in g}
        key = json.dumps({k: best["strategy"][k] for k in ("tp", "pp", "dp", "micro_batch_size")}, sort_keys=True)
        fastest = min(measured.values())
        gains.append(fastest / best["iteration_time_ms"] - 1)
        if key in measured:
            found += 1
            regrets.append(measured[key] / fastest - 1)
    regrets_a = np.asarray(regrets)
    print(f"  search (Megatron-DeepSpeed knobs: tp, pp, dp, micro-batch; full recompute, 1F1B) on {len(pick)} "
          f"groups: its best is a measured strategy in {found}; measured regret of those: "
          f"{_summary(regrets_a) if len(regrets_a) else 'n/a'}; predicted gain over the measured best: median "
          f"{100 * np.median(gains):.1f} %")

    print("Megatron SC21 Table 1 (held out of training): rank of the published strategy among the same family")
    for r in load_sc21():
        run, s = r.run, r.run["strategy"]
        cons = {"global_batch_size": s["global_batch_size"], "precision": "fp16", "micro_batch_size": [1],
                "recompute": ["full"], "zero_stages": [0], "sequence_parallel": [False], "schedules": ["1f1b"],
                "cp": [1], "fixed": {"flash_attention": False}, "max_candidates": 100000}
        _c, family = enumerate_strategies(predictor._specs.model(run["model"]),
                                          predictor._specs.hardware(run["hardware"]), cons)
        ranked = predictor.rank(run["model"], run["hardware"], family)
        published = {k: s[k] for k in ("tp", "pp", "dp")}
        pos = next((e["rank"] for e in ranked if e["rank"] is not None
                    and {k: e["strategy"][k] for k in ("tp", "pp", "dp")} == published), None)
        fits = sum(1 for e in ranked if e["rank"] is not None and e["prediction"]["fits_in_memory"])
        res = predictor.search(run["model"], run["hardware"], cons, top=1)
        line = (f"  {run['id']:8s} {run['hardware']['num_devices']:5d} GPUs: published tp{s['tp']} pp{s['pp']} "
                f"dp{s['dp']} ranks {pos} of {fits} that fit (fast tier)")
        if res["results"]:
            best = res["results"][0]
            b = best["strategy"]
            line += (f"; search's best tp{b['tp']} pp{b['pp']} dp{b['dp']} predicted {best['iteration_time_ms']:.0f} "
                     f"ms against the published one's measured {r.iteration_time_ms:.0f} ms")
        print(line)


if __name__ == "__main__":
    main()
