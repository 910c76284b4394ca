#!/usr/bin/env python3
"""Writes the U-Net graphs of this folder: python3 unet.py DEPTH BASE OUT.rkg [BATCH HW]
(unet-d2: 2 8, unet-d4: 4 8, unet-d6: 6 4 4 128)

Encoder levels of two 3x3 convolutions (each followed by a ReLU), a 2x2 pool
between levels, a bottleneck, decoder levels that upsample and convolve the
upsampled tensor concatenated with the encoder's skip tensor, a 1x1 head and
a loss. Batch 8, 3 input channels, 64x64 unless given, fp32. Times from a roofline model
(FLOPs at 20 TFLOP/s, bytes at 1 TB/s), workspaces a quarter of the output.
"""
import sys


def unet(depth, base, path, batch=8, hw=64):
    L = ["rockmate-graph 1",
         f"# U-Net: depth {depth}, base channels {base}, batch {batch}, {hw}x{hw}, fp32 (tests/graphs/unet.py)",
         f"tensor x {batch * 3 * hw * hw * 4} input", f"tensor y {batch * hw * hw * 4} input"]

    def conv(name, inp, ch, sz, cin, skip=None):
        by = batch * ch * sz * sz * 4
        t = 2 * batch * ch * cin * 9 * sz * sz / 2e13 + by / 1e12
        ins = inp if skip is None else inp + "," + skip
        L.append(f"tensor {name} {by}")
        L.append(f"op {name} fwd={t:.4e} bwd={2 * t:.4e} in={ins} out={name} saved={ins} "
                 f"fwd_ws={by // 4} bwd_ws={by // 4}")
        L.append(f"tensor {name}_r {by}")
        L.append(f"op {name}_r fwd={by / 1e12:.4e} bwd={by / 1e12:.4e} in={name} out={name}_r saved={name}_r")
        return name + "_r"

    cur, c, s, cin, skips = "x", base, hw, 3, []
    for d in range(depth):
        b = conv(f"e{d}b", conv(f"e{d}a", cur, c, s, cin), c, s, c)
        skips.append(b)
        s //= 2
        by = batch * c * s * s * 4
        L.append(f"tensor p{d} {by}")
        L.append(f"op p{d} fwd={4 * by / 1e12:.4e} bwd={4 * by / 1e12:.4e} in={b} out=p{d} saved={b}")
        cur, cin, c = f"p{d}", c, 2 * c
    cur, cin = conv("midb", conv("mida", cur, c, s, cin), c, s, c), c
    for d in reversed(range(depth)):
        s, c = 2 * s, c // 2
        by = batch * c * s * s * 4
        L.append(f"tensor u{d} {by}")
        L.append(f"op u{d} fwd={8 * by / 1e12:.4e} bwd={8 * by / 1e12:.4e} in={cur} out=u{d} saved={cur}")
        cur = conv(f"d{d}b", conv(f"d{d}a", f"u{d}", c, s, 2 * c, skip=skips[d]), c, s, c)
    by = batch * s * s * 4
    L.append(f"tensor head {by}")
    L.append(f"op head fwd={4 * by / 1e12:.4e} bwd={4 * by / 1e12:.4e} in={cur} out=head saved={cur}")
    L += ["tensor loss 4", "op loss fwd=2.0e-06 bwd=2.0e-06 in=head,y out=loss saved=head,y", "loss loss"]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


if __name__ == "__main__":
    extra = [int(a) for a in sys.argv[4:6]]
    unet(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], *extra)
