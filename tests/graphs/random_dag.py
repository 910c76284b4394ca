#!/usr/bin/env python3
"""Writes a random DAG graph: python3 random_dag.py OPS SEED OUT.rkg (dag60: 60 5)

Each op reads the previous op's output and, two times in three, one or two
earlier tensors (long skip edges, so the graph has few separators); sizes
16 to 264 KiB, forward times 0.5 to 5 ms (backward twice), random saved
lists, phantoms and workspaces. A last op reads every tensor no other op
reads and makes the loss. Python's random module: the same file on every
machine for a given seed.
"""
import random
import sys


def rdag(n, seed, path):
    r = random.Random(seed)
    L = ["rockmate-graph 1", f"# random DAG: {n} ops, seed {seed} (tests/graphs/random_dag.py)", "tensor in0 59392 input"]
    ts, read = ["in0"], set()
    for i in range(n):
        k = 1 if i == 0 else r.choice([1, 1, 1, 2, 2, 3])
        ins = [ts[-1]] + r.sample(ts[:-1], min(k - 1, len(ts) - 1)) if i else ["in0"]
        ins = list(dict.fromkeys(ins))
        read.update(ins)
        sz = r.choice([16, 32, 48, 64, 96, 128, 160, 192, 224, 256]) * 1024 + r.randint(0, 8) * 1024
        t = f"t{i}"
        L.append(f"tensor {t} {sz}")
        f = r.uniform(0.5e-3, 5e-3)
        sv = [x for x in ins + [t] if r.random() < 0.5]
        extra = " saved=" + ",".join(sv) if sv else ""
        if r.random() < 0.3:
            extra += f" phantom={r.randint(1, 100) * 1024}"
        if r.random() < 0.2:
            w = r.randint(1, 60) * 1024
            extra += f" fwd_ws={w} bwd_ws={w}"
        L.append(f"op op{i} fwd={f:.4e} bwd={2 * f:.4e} in={','.join(ins)} out={t}{extra}")
        ts.append(t)
    dang = [t for t in ts[1:] if t not in read]
    L += ["tensor loss 4", f"op lossop fwd=2.0e-06 bwd=2.0e-06 in={','.join(dang)} out=loss saved={','.join(dang)}",
          "loss loss"]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


if __name__ == "__main__":
    rdag(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
