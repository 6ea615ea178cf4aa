"""Rung 5 against rung 6 of the small-preset waterfall (their configs as the 2026-12-06 layout
benchmark recorded them) on 2 gloo ranks: both built in one launch, stepped on the same batches
in alternating windows; prints the median step (the slower rank's, s) of each and rung 6's speed
relative to rung 5. Run from the repository root:

    OMP_NUM_THREADS=1 python benchmarks/2026-12-06-cpu-rung6-regression/rung5_vs_rung6.py small 8 4
"""
import json
import statistics
import sys
import time

# rung 5 (load balance) and rung 6 (+ FSDP, row-sharded tables): waterfall.json's recorded configs
RUNG5 = dict(batch_size=256, jagged=True, kernel="auto", compile=True, compile_regions="sequence.mix,interaction",
             ac="auto", ac_budget=0.24465542562019144, ac_plan="sequence:FFF interaction:FFF cross:--F",
             balance="kk", mesh="2x1", sparse_sharding="none")
RUNG6 = {**RUNG5, "mesh": "1x2", "sparse_sharding": "row"}


def rank(r, world, preset, windows, steps):
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.data.loader import make_loader
    from gemref.data.sampler import StepBatches
    from gemref.train.compose import setup

    s6 = setup(preset, override(get_preset(preset).train, **RUNG6))
    s5 = setup(preset, override(get_preset(preset).train, **RUNG5))
    batches = iter(make_loader(s6.train_set, batch_sampler=StepBatches(s6.sampler, 0)))
    pool = [next(batches) for _ in range(steps)]
    for s in (s5, s6):
        for b in pool[:3]:
            s.step(b)
    times = {"r5": [], "r6": []}
    for w in range(windows):
        for name, s in (("r5", s5), ("r6", s6)) if w % 2 == 0 else (("r6", s6), ("r5", s5)):
            s.step(pool[0])    # the window's warm-up step
            for b in pool:
                t0 = time.perf_counter()
                s.step(b)
                times[name].append(time.perf_counter() - t0)
    return times


if __name__ == "__main__":
    from gemref.parallel.launch import spawn

    preset, windows, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    res = spawn(rank, 2, (preset, windows, steps), timeout_s=3000)
    t = {k: [max(a, b) for a, b in zip(res[0][k], res[1][k])] for k in ("r5", "r6")}
    m5, m6 = statistics.median(t["r5"]), statistics.median(t["r6"])
    print(json.dumps({"r5_step_s": round(m5, 4), "r6_step_s": round(m6, 4), "r6_over_r5_speed": round(m5 / m6, 3),
                      "steps": len(t["r5"])}))
