"""Two checkouts of the lens side by side: the tracer's ratios, measured in fresh processes taking turns.

    python benchmarks/ab.py TREE_A TREE_B [--runs 4] [--rounds 60]

Each run starts one fresh Python per tree (A, B, B, A, ...), with the tree first on ``sys.path``; each Python
measures ``bench_tracer``'s rows (MLP traced, traced + model, a hook returning None, a halving hook, the teaching
graph) with ``--rounds`` alternated passes and prints their ratios to plain; the two "block" rows time the whole
``with Lens(names=...): backward()`` (its set-up and end included) against a plain backward().  Times are the CPU time of the
measuring thread (``time.thread_time``: torch runs on one thread here), so another process on the machine moves
them far less than wall time.  Prints each row's median over the runs for A and B and B's change.  A change of a
few per cent needs ``--runs 6`` or more; below ~2% use an in-process toggle instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
time.perf_counter = time.thread_time  # the measuring thread's CPU time (torch: one thread)
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import bench_tracer as b
rounds = int(sys.argv[2])
m = b.measure(rounds=rounds)
h = b.measure_hooked(rounds=rounds)
t = b.measure_teaching(rounds=rounds * 3)


def block(model, loss_of, lens_of, rounds):  # medians (s): a plain backward(), a whole `with Lens(): backward()`
    def one(lens):
        model.zero_grad(set_to_none=True)
        loss = loss_of()
        start = time.perf_counter()
        if lens is None:
            loss.backward()
        else:
            with lens:
                loss.backward()
        return time.perf_counter() - start
    plain, traced = [], []
    for index in range(rounds + 10):
        p, q = one(None), one(lens_of())
        if index >= 10:
            plain.append(p)
            traced.append(q)
    return statistics.median(plain), statistics.median(traced)


mlp, x = b.build()
mb = block(mlp, lambda: mlp(x).sum(), lambda: b.al.Lens(names={"model": mlp, "x": x}), rounds)
tm, tx, ty = b.teaching_model()
tb = block(tm, lambda: ((tm(tx) - ty) ** 2).mean(), lambda: b.al.Lens(names={"model": tm, "x": tx, "y": ty}),
           rounds * 3)
print(json.dumps({
    "MLP traced": m["traced"] / m["plain"],
    "traced + model": m["traced_model"] / m["plain"],
    "hook returns None": h["returns None"]["traced"] / h["returns None"]["plain"],
    "hook halves": h["halves the gradient"]["traced"] / h["halves the gradient"]["plain"],
    "teaching (+ms)": (t["traced"] - t["plain"]) * 1e3,
    "MLP block (+ms)": (mb[1] - mb[0]) * 1e3,  # with the Lens block's set-up and end
    "teaching block (+ms)": (tb[1] - tb[0]) * 1e3,
}))
"""


def one(tree: str, rounds: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, os.path.abspath(tree), str(rounds)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args(argv)
    found = {"a": [], "b": []}
    for run in range(args.runs):
        order = ("a", "b") if run % 2 == 0 else ("b", "a")
        for side in order:
            found[side].append(one(getattr(args, side), args.rounds))
    print(f"{'row':<20} {'A':>8} {'B':>8} {'B/A':>8}   (medians of {args.runs} runs, {args.rounds} rounds each)")
    for row in found["a"][0]:
        a = statistics.median(r[row] for r in found["a"])
        b = statistics.median(r[row] for r in found["b"])
        print(f"{row:<20} {a:8.2f} {b:8.2f} {b / a:8.3f}")


if __name__ == "__main__":
    main()
