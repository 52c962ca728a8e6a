"""How many measured kernels of a new GPU does the operator regressor need?

A GPU nobody measured is predicted from its data sheet alone, and the held-out evaluation shows
where that stops: the V100 reaches a larger share of its data-sheet peak and bandwidth than any of the
other four GPUs, so every method trained on them predicts it slow (``unseen_device:V100`` in the
README). A user who owns the device can measure some of its kernels (``learnedperf measure``) and
train on them: the regressor then learns the device's offsets, by how much its kernels deviate from
what its data sheet predicts (:class:`~learnedperf.models.OpTimeRegressor`, ``device_offsets_``). This
script measures what that buys, one held-out GPU at a time:

* the regressor is trained as the shipped one is (:func:`~learnedperf.models.pipeline.fit_op_regressor`:
  the GPUs' operator records, at most ``--rows-per-device`` of each, seed 0) on the *other* GPUs plus
  ``k`` kernels of the held-out one, drawn at random (seeded) from its NeuSight records;
* it is scored on every *other* record of the held-out GPU (operator MAPE), and
* the simulator on its operator costs (``simulator+ops``, :class:`~learnedperf.models.LearnedOpCost`) on
  the held-out GPU's measured NeuSight steps (MAPE of iteration time), which no ``k`` ever includes:
  kernels are single-op timings, the steps whole models.

``k = 0`` is the leave-one-device-out protocol of ``experiments/op_regressor_accuracy.py`` and of the
held-out evaluation's device splits. Each ``k > 0`` is drawn ``--draws`` times with different seeds, and
the mean and the range over draws are printed. The ``trees alone`` columns score the same model with
the offsets taken out: what the held-out GPU's kernels moved in the trees themselves.

    python experiments/few_shot_device.py [--devices V100,T4] [--k 0,30,100,300,1000] [--draws 3]
                                          [--rows-per-device 30000] [--prior-rows 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd


def main(argv=None) -> int:
    """Fit and score the regressor per held-out GPU and number of its kernels; print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="",
                    help="comma-separated substrings of the GPUs to hold out (default: every NeuSight GPU)")
    ap.add_argument("--k", default="0,30,100,300,1000", help="kernels of the held-out GPU to train on")
    ap.add_argument("--draws", type=int, default=3, help="random draws of each k > 0")
    ap.add_argument("--rows-per-device", type=int, default=30000)
    ap.add_argument("--prior-rows", type=float, default=None,
                    help="OpTimeRegressor's device_offset_prior_rows (default: the shipped value)")
    args = ap.parse_args(argv)
    try:
        ks = sorted({int(x) for x in args.k.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--k {args.k!r}: expected comma-separated integers")
    if not ks or ks[0] < 0:
        ap.error("--k: expected integers >= 0")
    if args.draws < 1:
        ap.error("--draws: expected >= 1")

    from learnedperf.errors import LearnedPerfError
    from learnedperf.measure.public import load_neusight_steps
    from learnedperf.models import LearnedOpCost, OpTimeRegressor
    from learnedperf.models.dataset import device_class
    from learnedperf.models.gbdt import draw_per_device, load_op_training_data
    from learnedperf.simulate import simulate
    from learnedperf.specs import RunSpec

    def simulated_ms(spec, model) -> float:
        """``simulator+ops``: the simulator on the model's operator costs (the roofline's where it has none)."""
        return simulate(spec, cost=LearnedOpCost(spec.hardware, model).prefetch_run(spec)).iteration_time_s * 1e3

    t0 = time.perf_counter()
    try:
        # every record: the held-out GPU's kernels are drawn from and scored on these
        every = load_op_training_data()
        steps = load_neusight_steps().records
    except LearnedPerfError as exc:
        print(f"few_shot_device: error: {exc}", file=sys.stderr)
        return 1

    def gpus(df):
        return df[(df["device_name"].astype(str).map(device_class) != "cpu").to_numpy()].reset_index(drop=True)

    # the rows the shipped regressor trains on (fit_op_regressor: rows_per_device of each, seed 0), drawn from the
    # same records as load_op_training_data(rows_per_device=...) draws them, without reading them again
    every, drawn = gpus(every), gpus(draw_per_device(every, args.rows_per_device, seed=0)[0])
    names = sorted(every["device_name"].unique())
    wanted = [w.strip() for w in args.devices.split(",") if w.strip()]
    held_out = [n for n in names if not wanted or any(w in n for w in wanted)]
    if not held_out:
        print(f"few_shot_device: no GPU matches {args.devices!r}; GPUs: {', '.join(names)}", file=sys.stderr)
        return 1
    prior = {} if args.prior_rows is None else {"device_offset_prior_rows": args.prior_rows}
    device_rows = {n: np.flatnonzero(every["device_name"].to_numpy() == n) for n in names}

    print(f"# {len(every)} GPU operator records of {len(names)} GPUs; training rows per other GPU <= "
          f"{args.rows_per_device}; k = {ks}, {args.draws} draw(s) per k > 0")
    print(f"{'held-out GPU':<16} {'k':>5} {'op MAPE %':>10} {'trees alone':>11} {'steps':>5} "
          f"{'simulator+ops %':>15} {'range':>11} {'bias':>6} {'trees alone':>11}")
    for held in held_out:
        own_steps = [(RunSpec.from_dict(json.loads(r["run"]) if isinstance(r["run"], str) else r["run"]),
                      float(r["iteration_time_ms"])) for r in steps if r["device_name"] == held]
        others = drawn[(drawn["device_name"] != held).to_numpy()]
        own = device_rows[held]
        for k in ks:
            got = {"offsets": ([], [], []), "trees": ([], [], [])}
            for draw in range(1 if k == 0 else args.draws):
                pick = np.random.default_rng(1000 + draw).choice(own, min(k, len(own)), replace=False) if k else own[:0]
                train = pd.concat([others, every.iloc[pick]], ignore_index=True)
                model = OpTimeRegressor(random_state=0, **prior).fit_records(train)
                test = every.iloc[np.setdiff1d(own, pick)]
                true = test["time_ms"].to_numpy()
                learnt = model.device_offsets_
                for label, offsets in (("offsets", learnt), ("trees", {})):
                    model.device_offsets_ = offsets  # the same trees, with and without the held-out GPU's offsets
                    op_mape, step_mape, bias = got[label]
                    op_mape.append(float(np.mean(np.abs(model.predict_records(test) - true) / true)) * 100)
                    if own_steps:
                        ratios = np.array([simulated_ms(spec, model) / ms for spec, ms in own_steps])
                        step_mape.append(float(np.mean(np.abs(ratios - 1))) * 100)
                        bias.append(float(np.mean(np.log(ratios))))

            (op_o, st_o, bias_o), (op_t, st_t, _) = got["offsets"], got["trees"]
            span = f"{min(st_o):4.1f}-{max(st_o):4.1f}" if len(st_o) > 1 else ""
            steps_part = (f"{np.mean(st_o):>15.1f} {span:>11} {np.mean(bias_o):>+6.2f} {np.mean(st_t):>11.1f}"
                          if own_steps else f"{'-':>15} {'':>11} {'':>6} {'-':>11}")
            print(f"{held:<16} {k:>5} {np.mean(op_o):>10.1f} {np.mean(op_t):>11.1f} {len(own_steps):>5} {steps_part}",
                  flush=True)
    print(f"# op MAPE over the held-out GPU's other records; simulator+ops MAPE over its measured steps, mean and "
          f"range over the draws; bias = mean log(predicted / measured) over the steps; 'trees alone': the same "
          f"model without device offsets; {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
