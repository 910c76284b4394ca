#!/usr/bin/env python3
"""Writes a random DAG graph: python3 random_dag.py OPS SEED OUT.rkg [BLOCKS]
(dag60: 60 5; dag100: 100 7; dag4x50: 50 7 dag4x50.rkg 4; dag6x30-s17: 30 17
dag6x30-s17.rkg 6)

Each op reads the previous op's output and, two times in three, one or two
earlier tensors (long skip edges, so the graph has few separators); sizes
16 to 264 KiB, forward times 0.5 to 5 ms (backward twice), random saved
lists, phantoms and workspaces. A last op reads every tensor no other op
reads and makes the loss. With BLOCKS, the graph is a chain of that many
copies of such a DAG of OPS ops (the same seed, so one class of blocks),
each ended by a join op that reads its unread tensors into a 64 KiB block
output, which the next copy reads as its input. Python's random module:
the same file on every machine for a given seed.
"""
import random
import sys


def dag_ops(r, n, x, name, L):
    """n random ops after tensor x, names from name(i) (tensor, op); the unread tensors."""
    ts, read = [x], set()
    for i in range(n):
        k = 1 if i == 0 else r.choice([1, 1, 1, 2, 2, 3])
        ins = [ts[-1]] + r.sample(ts[:-1], min(k - 1, len(ts) - 1)) if i else [x]
        ins = list(dict.fromkeys(ins))
        read.update(ins)
        sz = r.choice([16, 32, 48, 64, 96, 128, 160, 192, 224, 256]) * 1024 + r.randint(0, 8) * 1024
        t, op = name(i)
        L.append(f"tensor {t} {sz}")
        f = r.uniform(0.5e-3, 5e-3)
        sv = [x for x in ins + [t] if r.random() < 0.5]
        extra = " saved=" + ",".join(sv) if sv else ""
        if r.random() < 0.3:
            extra += f" phantom={r.randint(1, 100) * 1024}"
        if r.random() < 0.2:
            w = r.randint(1, 60) * 1024
            extra += f" fwd_ws={w} bwd_ws={w}"
        L.append(f"op {op} fwd={f:.4e} bwd={2 * f:.4e} in={','.join(ins)} out={t}{extra}")
        ts.append(t)
    return [t for t in ts[1:] if t not in read]


def rdag(n, seed, path, blocks=0):
    what = f"a chain of {blocks} random DAG blocks of {n} ops" if blocks else f"random DAG: {n} ops"
    L = ["rockmate-graph 1", f"# {what}, seed {seed} (tests/graphs/random_dag.py)", "tensor in0 59392 input"]
    if not blocks:
        dang = dag_ops(random.Random(seed), n, "in0", lambda i: (f"t{i}", f"op{i}"), L)
    else:
        x = "in0"
        for b in range(blocks):
            dang = dag_ops(random.Random(seed), n, x, lambda i: (f"b{b}t{i}", f"b{b}op{i}"), L)
            x = f"b{b}out"
            L += [f"tensor {x} 65536",
                  f"op b{b}join fwd=2.0e-04 bwd=4.0e-04 in={','.join(dang)} out={x} saved={','.join(dang)}"]
        dang = [x]
    L += ["tensor loss 4", f"op lossop fwd=2.0e-06 bwd=2.0e-06 in={','.join(dang)} out=loss saved={','.join(dang)}",
          "loss loss"]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


if __name__ == "__main__":
    rdag(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 0)
