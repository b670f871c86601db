#!/usr/bin/env python3
"""cost_model.py: an alpha-beta cost model of kolo across nodes.

Fitted from the shaped-link cluster measurements kept in docs/data/cluster-*
(bench/cluster/cluster.py: K nodes x 1 rank, 500 Mbit/s and 1 Gbit/s links),
checked against every stored K = 2/4/8 point (busbw per size, 4-byte latency,
model-step efficiency with compute in the loop), then used to predict clusters
we cannot build here (N nodes x G GPUs at 25-400 Gbit/s).

The model (t in seconds, S bytes, R link rate in bit/s):
  link          beta = 8 / (eta R)  (eta: the fraction of the wire kolo's ring reaches)
  ring, K       t = 2(K-1)/K S beta + 2(K-1) alpha
  tree (DBT)    t = 2 S beta + 2 log2(K) (alpha + C beta / 2)      (pipelined double binary tree, chunk C)
  hierarchical  t = max(ring_N(S), 2 S / B_intra) + 2 min(S, C) / B_intra    (kolo: local reduce into the
                agent's staging over G ranks, ring across N agents, drain back; chunk-pipelined, C = 8 MiB)
  flat ring     ring over P = N G ranks; the NIC carries one ring edge each way: 2(P-1)/P S beta + 2(P-1) alpha
  kolo's own    negotiation per cycle t_neg(N) = ceil(log2 N) alpha_sw (one small Min-reduction, recursive
                doubling below the 64 KiB switch point), copies in/out of the fusion buffer S gamma (user
                memory; none with kolo_alloc_shared), the coordinator only at job start.
  4-byte op     t4(K) = c0 + 2 log2(K) alpha_sw over(K): negotiation + the recursive-doubling allreduce;
                over(K) = 2K processes / cores (the VM: an agent and a rank per node on 2 cores), 1 on a cluster.
  step          forward F (no communication), then the backward pass B spread over the gradients (by FLOPs from
                bench/models/NAME.flops, else by parameters), gradients ready in reverse order; a cycle starts when
                something is ready, its Min-reduction rides the backend's queue (ends t_neg after the collectives
                already posted), its ready gradients are fused up to the threshold (128 MiB) and allreduced in
                order on one channel. Host contention: the compute is slowed by kappa x the ring time beside it
                (fitted on the VM's 2 shared cores; 0 for GPUs). step = F + max(B + kappa overlap, last allreduce
                end); efficiency = (F + B) / step.

    bench/cluster/cost_model.py                 # fit, error table, 64/512-GPU predictions
    bench/cluster/cost_model.py --plot docs/img/cluster_efficiency.png
    bench/cluster/cost_model.py --check         # ctest bench.cost_model: exit 1 if an error bound is broken
    bench/cluster/cost_model.py --alpha-us 50 --intra-gbs 50     # the predictions' sensitivity

Python 3 standard library (matplotlib for --plot only). Exit: 0 ok, 1 a --check bound broken, 2 bad data.
"""
import argparse
import glob
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
MODELS = os.path.join(ROOT, "bench", "models")
MiB = 1 << 20

# --check bounds (relative |error| of the model on the stored measurements).
BOUND_BUSBW_MEDIAN = 0.10   # every busbw point
BOUND_BUSBW_MAX_1G = 0.15    # each 1 Gbit/s point (the 500 Mbit/s K=4/8 runs reached 0.53-0.60 R for kolo and Gloo
                             # alike, the loaded host rather than the link: reported, not bounded)
BOUND_LAT_MAX = 0.40         # the measured K=2 4-byte latencies alone spread 247-436 us
BOUND_EFF_MAX = 0.06         # VGG-16 K=8 with compute = 1 x the ring: 5.6% (kolo's ring at 0.85 R there)

VM_CORES = 2
FUSION_THRESHOLD = 128 * MiB
CHUNK = 8 * MiB

# Model-step efficiencies with compute in the loop (compute = 2 x the ring's time for the model at R, by
# FLOPs), 1 Gbit/s, from docs/benchmarks.md "Model step" (2026-11-26; only the two fusion-off rows' logs
# are kept, in docs/data/cluster-2026-11-26/summary-zc.txt, and are read from there).
DOC_EFFICIENCY = [("resnet50", 2, 0.974), ("resnet50", 4, 0.979), ("resnet50", 8, 0.968),
                  ("vgg16", 2, 0.990), ("vgg16", 4, 0.962)]


def rate_bps(s):
    m = re.fullmatch(r"([\d.]+)([kmg])bit", s.strip().lower())
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def size_bytes(s):
    m = re.fullmatch(r"(\d+)\s*([KMG])iB", s.strip())
    return int(m.group(1)) << {"K": 10, "M": 20, "G": 30}[m.group(2)]


# ---------------------------------------------------------------- measurements
def load_measurements(data_dir):
    """busbw rows (K, R, mem, size, frac of R), 4-byte latencies (K, us) and model steps from summaries."""
    bw, lat, steps = [], [], []
    files = sorted(glob.glob(os.path.join(data_dir, "cluster-*", "summary*.txt")))
    for f in files:
        txt = open(f).read()
        hdr = re.search(r"^# nodes .*$", txt, re.M)
        mem = "shared" if hdr and "--zero-copy" in hdr.group(0) else "user"
        cols = None
        for line in txt.splitlines():
            if line.startswith("| K | R |") and "peer" in line:
                cols = [c.strip() for c in line.strip("|").split("|")]
                continue
            if not line.startswith("| ") or cols is None or line.startswith("|---"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) != len(cols):
                continue
            row = dict(zip(cols, cells))
            if not row.get("peer", "").startswith("kolo"):
                continue
            k, r = int(row["K"]), rate_bps(row["R"])
            src = os.path.relpath(f, data_dir)
            for c in cols:
                if c.endswith("MiB") and row[c] not in ("", "-"):
                    bw.append(dict(k=k, r=r, mem=mem, size=size_bytes(c), frac=float(row[c]), src=src,
                                   peer=row["peer"]))
            if row.get("4 B us"):
                lat.append(dict(k=k, us=float(row["4 B us"]), src=src, peer=row["peer"], mem=mem))
        # "(2 x the ring's" in older summaries, "(1.00 x the ring's" now: the ratio is compute / ring either way
        for m in re.finditer(r"model step (\w+)(?: \(compute by (\w+)\))?, kolo-(\w+), fusion (\w+)"
                             r"(?:, kolo_alloc_shared)?: compute ([\d.]+) ms"
                             r" \([\d.]+ x the ring's ([\d.]+) ms at R\), step ([\d.]+) ms.*?efficiency ([\d.]+)", txt):
            # the K of a model line: the last "## K=" header before it
            k = int(re.findall(r"## K=(\d+)", txt[:m.start()])[-1])
            steps.append(dict(model=m.group(1), k=k, fusion=m.group(4), compute_ms=float(m.group(5)),
                              ratio=float(m.group(5)) / float(m.group(6)), eff=float(m.group(8)), src=os.path.relpath(f, data_dir), mem=mem))
    return bw, lat, steps


# ---------------------------------------------------------------- models (tensor lists)
def load_model(name):
    """[(name, bytes)] in registration order (float32) and each tensor's share of the backward compute."""
    tensors = []
    for l in open(os.path.join(MODELS, name + ".txt")):
        if l.strip() and not l.startswith("#"):
            p = l.split()
            tensors.append((p[0], int(p[1]) * 4))
    w = {t: float(b) for t, b in tensors}
    prof = os.path.join(MODELS, name + ".flops")
    if os.path.exists(prof):
        w = {t: 0.0 for t, _ in tensors}
        for l in open(prof):
            if l.strip() and not l.startswith("#"):
                p = l.split()
                w[p[0]] = float(p[1])
    tot = sum(w.values())
    return tensors, [w[t] / tot for t, _ in tensors], os.path.exists(prof)


# ---------------------------------------------------------------- the cost model
class Params:
    def __init__(self, eta=0.92, alpha=10e-6, alpha_sw=10e-6, c0=0.0, gamma=0.0, over=lambda k: 1.0, kappa=0.0):
        self.eta, self.alpha, self.alpha_sw, self.c0, self.gamma, self.over = eta, alpha, alpha_sw, c0, gamma, over
        self.kappa = kappa

    def but(self, **kw):
        q = Params(self.eta, self.alpha, self.alpha_sw, self.c0, self.gamma, self.over, self.kappa)
        q.__dict__.update(kw)
        return q


def ring(S, K, R, p):
    if K <= 1:
        return 0.0
    return 2.0 * (K - 1) / K * S * 8 / (p.eta * R) + 2 * (K - 1) * p.alpha


def tree(S, K, R, p):
    if K <= 1:
        return 0.0
    beta = 8 / (p.eta * R)
    return 2 * S * beta + 2 * math.log2(K) * (p.alpha + min(S, CHUNK) * beta / 2)


def t_neg(K, p):
    return math.ceil(math.log2(K)) * p.alpha_sw * p.over(K) if K > 1 else 0.0


def lat4(K, p):
    return p.c0 + 2 * math.log2(K) * p.alpha_sw * p.over(K)


def allreduce(S, N, G, R, p, algo, b_intra):
    """One fused allreduce of S bytes over N nodes x G ranks, kolo's copies included."""
    copy = S * p.gamma
    if N <= 1 and G <= 1:
        return copy
    if algo == "ring":                     # flat ring over all N G ranks
        return ring(S, N * G, R, p) if N > 1 else 2 * S / b_intra
    local = 2 * S / b_intra if G > 1 else 0.0
    fill = 2 * min(S, CHUNK) / b_intra if G > 1 else 0.0
    cross = ring(S, N, R, p) if algo == "hier" else tree(S, N, R, p)
    return max(cross, local) + fill + copy


def step(model, N, G, R, p, algo="hier", backward_s=1.0, forward_s=0.0, b_intra=100e9,
         threshold=FUSION_THRESHOLD, detail=None):
    """Simulated step time: backward gradients ready in reverse order, negotiated per cycle, fused, allreduced."""
    tensors, share, _ = model
    order = list(range(len(tensors)))[::-1]
    ready, t = [], 0.0
    for i in order:
        t += share[i] * backward_s
        ready.append((t, tensors[i][1]))
    neg = t_neg(N, p)
    now, comm_free, j, busy = 0.0, 0.0, 0, []
    while j < len(ready):
        now = max(now, ready[j][0])                  # a cycle starts when something is ready
        batch = []
        while j < len(ready) and ready[j][0] <= now:
            batch.append(ready[j][1])
            j += 1
        # the cycle's Min-reduction rides the backend's queue: it ends after the collectives already posted
        now = max(now, comm_free) + neg
        comm_free = now
        fused = 0
        for b in batch + [None]:                     # fuse the cycle's gradients up to the threshold
            if b is not None and fused + b <= threshold:
                fused += b
                continue
            if fused:
                d = allreduce(fused, N, G, R, p, algo, b_intra)
                busy.append((comm_free, comm_free + d))
                comm_free += d
            fused = b or 0
    # host contention (fitted kappa): the trainer's compute slows by kappa of the time a ring runs beside it
    overlap = sum(max(0.0, min(e, backward_s) - s) for s, e in busy)
    if detail is not None:
        detail.update(overlap=overlap, comm_end=comm_free, base=forward_s + max(backward_s, comm_free))
    return forward_s + max(backward_s + p.kappa * overlap, comm_free)


# ---------------------------------------------------------------- fitting
def lsq(X, y):
    """Least squares for a few unknowns (normal equations, Gauss-Jordan): min |X a - y|."""
    n = len(X[0])
    A = [[sum(r[i] * r[j] for r in X) for j in range(n)] + [sum(r[i] * v for r, v in zip(X, y))] for i in range(n)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(A[r][c]))
        A[c], A[piv] = A[piv], A[c]
        for r in range(n):
            if r != c:
                f = A[r][c] / A[c][c]
                A[r] = [a - f * b for a, b in zip(A[r], A[c])]
    return [A[i][n] / A[i][i] for i in range(n)]


def fit(bw, lat):
    """eta and alpha from the kolo_alloc_shared rows, gamma (copies) from the user-memory rows, c0 and alpha_sw
    from the 4-byte latencies; every fit weighs relative error (each equation divided by the measurement)."""
    def t_meas(r):
        return 2.0 * (r["k"] - 1) / r["k"] * r["size"] * 8 / (r["frac"] * r["r"])
    # shared: t = x0 * [2(K-1)/K S 8/R] + x1 * [2(K-1)], x0 = 1/eta, x1 = alpha
    X, y = [], []
    for r in bw:
        if r["mem"] == "shared":
            tm = t_meas(r)
            X.append([2.0 * (r["k"] - 1) / r["k"] * r["size"] * 8 / r["r"] / tm, 2.0 * (r["k"] - 1) / tm])
            y.append(1.0)
    inv_eta, alpha = lsq(X, y)
    alpha = max(alpha, 0.0)
    p = Params(eta=1 / inv_eta, alpha=alpha)
    # user memory: t = shared model + gamma S
    X, y = [], []
    for r in bw:
        if r["mem"] == "user":
            tm = t_meas(r)
            X.append([r["size"] / tm])
            y.append((tm - ring(r["size"], r["k"], r["r"], p)) / tm)
    p.gamma = max(lsq(X, y)[0], 0.0)
    # 4-byte: t4 = c0 + 2 log2 K over(K) alpha_sw, over(K) = 2K / VM_CORES
    over = lambda k: max(1.0, 2.0 * k / VM_CORES)
    X = [[1 / (r["us"] * 1e-6), 2 * math.log2(r["k"]) * over(r["k"]) / (r["us"] * 1e-6)] for r in lat]
    c0, a_sw = lsq(X, [1.0] * len(lat))
    p.c0, p.alpha_sw, p.over = max(c0, 0.0), a_sw, over
    return p


def check_errors(bw, lat, steps, p, models):
    """Relative errors of the model on every stored point."""
    out = {"busbw": [], "lat": [], "eff": []}
    for r in bw:
        pp = p.but(gamma=p.gamma if r["mem"] == "user" else 0.0)
        t = ring(r["size"], r["k"], r["r"], pp) + r["size"] * pp.gamma
        pred = 2.0 * (r["k"] - 1) / r["k"] * r["size"] * 8 / t / r["r"]
        out["busbw"].append((r, pred, (pred - r["frac"]) / r["frac"]))
    for r in lat:
        pred = lat4(r["k"], p) * 1e6
        out["lat"].append((r, pred, (pred - r["us"]) / r["us"]))
    pv = p.but(gamma=0.0)     # zero copy (--zero-copy runs)
    for m, k, e, src, ratio in eff_points(steps):
        pred = harness_eff(models[m], k, 1e9, pv, ratio=ratio)
        out["eff"].append((dict(model=m, k=k, eff=e, src=src, ratio=ratio), pred, (pred - e) / e))
    return out


def eff_points(steps):
    pts = [(s["model"], s["k"], s["eff"], s["src"] + " (fusion %s)" % s["fusion"], s["ratio"]) for s in steps]
    return pts + [(m, k, e, "docs/benchmarks.md Model step", 2.0) for m, k, e in DOC_EFFICIENCY]


def harness_eff(model, K, R, p, detail=None, ratio=2.0):
    """cluster.py --model: compute = ratio x the ring's time at R (ideal wire; 2 unless --compute-ms), backward
    only, one rank per node."""
    S = sum(b for _, b in model[0])
    compute = ratio * (2.0 * (K - 1) / K * S * 8 / R)
    return compute / step(model, K, 1, R, p, algo="hier", backward_s=compute, detail=detail)


def fit_kappa(p, steps, models):
    """kappa (host contention) by least squares on the measured steps: step = base + kappa x overlap."""
    num = den = 0.0
    for m, k, e, _, ratio in eff_points(steps):
        d = {}
        eff0 = harness_eff(models[m], k, 1e9, p.but(gamma=0.0, kappa=0.0), d, ratio=ratio)
        tm = d["base"] * eff0 / e                      # measured step = compute / efficiency
        num += d["overlap"] * (tm - d["base"]) / tm ** 2
        den += d["overlap"] ** 2 / tm ** 2
    p.kappa = max(num / den, 0.0) if den else 0.0


# ---------------------------------------------------------------- predictions
# Per-GPU step on an H100 (assumptions, stated in docs/benchmarks.md): training FLOPs = 3 x forward, at a
# model FLOPs utilisation (MFU) of 989 TFLOP/s dense BF16; forward = 1/3 of the step, not overlapped.
H100_FLOPS = 989e12
WORKLOADS = {
    # name: (forward FLOPs per sample, samples per GPU per step, MFU, note)
    "resnet50": (8.18e9, 256, 0.075, "batch 256, MFU 7.5% (~3000 img/s, NVIDIA's published H100 figure)"),
    "bert_large": (2 * 335.1e6 * 512, 32, 0.40, "32 x 512 tokens, MFU 40%"),
    "vgg16": (30.94e9, 128, 0.25, "batch 128, MFU 25%"),
}
PRED_RATES = [25e9, 100e9, 200e9, 400e9]
PRED_GPUS = [64, 512]
GPUS_PER_NODE = 8
B_INTRA = 100e9          # local reduce into the agent's staging over 8 GPUs (NVLink class; assumption)
ALPHA_NET = 10e-6        # one message, node to node, kolo software included, on a real cluster (assumption)
GAMMA_GPU = 1 / 667e9    # device path copy in/out of the arena: 256 MiB in 402.8 us on the H200 (GPU section)


def compute_s(name):
    f, b, mfu, _ = WORKLOADS[name]
    return 3 * f * b / (H100_FLOPS * mfu)


def cluster_params(p):
    """The fitted link efficiency; a real cluster's per-message latency; no oversubscription; GPU copies."""
    return Params(eta=p.eta, alpha=ALPHA_NET, alpha_sw=ALPHA_NET, c0=0.0, gamma=GAMMA_GPU, over=lambda k: 1.0)


def predict(name, model, gpus, R, p, algo):
    tot = compute_s(name)
    n = gpus // GPUS_PER_NODE
    st = step(model, n, GPUS_PER_NODE, R, p, algo=algo, backward_s=tot * 2 / 3, forward_s=tot / 3,
              b_intra=B_INTRA)
    return tot / st, st


# ---------------------------------------------------------------- output
def pct(x):
    return "%+.1f%%" % (100 * x)


def report(p, errs, models, cp):
    print("# cost_model.py: fitted from %d busbw points, %d 4-byte latencies (docs/data/cluster-*)"
          % (len(errs["busbw"]), len(errs["lat"])))
    print("eta (kolo ring / wire, kolo_alloc_shared) = %.3f   alpha (per ring step, large) = %.1f us" % (p.eta, p.alpha * 1e6))
    print("gamma (user memory copies, not hidden)    = %.3f ns/B  (= %.2f GB/s)" % (p.gamma * 1e9, 1 / p.gamma / 1e9 if p.gamma else 0))
    print("4 B: c0 = %.0f us, alpha_sw = %.1f us per round x over(K) = 2K/%d cores" % (p.c0 * 1e6, p.alpha_sw * 1e6, VM_CORES))
    print("kappa (compute slowed per second of ring beside it, 2 shared cores) = %.3f" % p.kappa)
    print("\n## Error of the model on the stored measurements (model - measured) / measured")
    groups = {}
    for r, pred, e in errs["busbw"]:
        groups.setdefault((r["k"], r["r"], r["mem"]), []).append(e)
    print("| K | R | memory | busbw points | median error | max abs error |")
    print("|---|---|---|---|---|---|")
    for (k, r, mem), es in sorted(groups.items()):
        es_s = sorted(es)
        print("| %d | %g Gbit/s | %s | %d | %s | %.0f%% |" % (k, r / 1e9, mem, len(es), pct(es_s[len(es) // 2]),
                                                         100 * max(abs(x) for x in es)))
    print("\n| K | 4 B measured (us) | model (us) | error |")
    print("|---|---|---|---|")
    for r, pred, e in sorted(errs["lat"], key=lambda x: (x[0]["k"], x[0]["us"])):
        print("| %d | %.0f | %.0f | %s |" % (r["k"], r["us"], pred, pct(e)))
    print("\n| model | K | efficiency measured | model | error | source |")
    print("|---|---|---|---|---|---|")
    for r, pred, e in errs["eff"]:
        print("| %s | %d | %.3f | %.3f | %s | %s |" % (r["model"], r["k"], r["eff"], pred, pct(e), r["src"]))
    s = summary(errs)
    print("\nbusbw: median |error| %.1f%%, max %.0f%% (1 Gbit/s: %.0f%%); 4 B: max %.0f%%; efficiency: max %.1f%%"
          % (100 * s["bw_med"], 100 * s["bw_max"], 100 * s["bw_max_1g"], 100 * s["lat_max"], 100 * s["eff_max"]))

    print("\n## Predictions: %d GPUs per node, eta %.2f, alpha %.0f us per message, local reduce %.0f GB/s, "
          "GPU copies %.0f GB/s, fp32 gradients, fusion %d MiB" % (GPUS_PER_NODE, cp.eta, cp.alpha * 1e6,
                                                                   B_INTRA / 1e9, 1 / cp.gamma / 1e9,
                                                                   FUSION_THRESHOLD // MiB))
    for name in WORKLOADS:
        print("#  %s: step %.0f ms compute on an H100 (%s), gradients %.0f MB" % (
            name, compute_s(name) * 1e3, WORKLOADS[name][3], sum(b for _, b in models[name][0]) / 1e6))
    print("| model | GPUs (nodes) | algorithm | " + " | ".join("%g Gbit/s" % (r / 1e9) for r in PRED_RATES) + " |")
    print("|---|---|---|" + "---|" * len(PRED_RATES))
    for name in WORKLOADS:
        for g in PRED_GPUS:
            for algo in ("hier", "tree", "ring"):
                effs = [predict(name, models[name], g, r, cp, algo)[0] for r in PRED_RATES]
                print("| %s | %d (%d) | %s | %s |" % (name, g, g // GPUS_PER_NODE,
                                                      {"hier": "hierarchical (kolo)", "tree": "local + tree",
                                                       "ring": "flat ring"}[algo],
                                                      " | ".join("%.2f" % e for e in effs)))
    print("\n## kolo's own costs against N (nodes), cluster parameters")
    print("| N | negotiation per cycle = ceil(log2 N) alpha | flat-ring latency 2(NG-1) alpha | ring latency "
          "2(N-1) alpha | copies per 100 MB (S gamma, any N) |")
    print("|---|---|---|---|---|")
    for n in (2, 8, 64):
        print("| %d | %.0f us | %.1f ms | %.2f ms | %.0f us |" % (n, t_neg(n, cp) * 1e6,
                                                           2 * (n * GPUS_PER_NODE - 1) * cp.alpha * 1e3,
                                                           2 * (n - 1) * cp.alpha * 1e3, 100e6 * cp.gamma * 1e6))


def summary(errs):
    bwe = sorted(abs(e) for _, _, e in errs["busbw"])
    bw1 = max(abs(e) for r, _, e in errs["busbw"] if r["r"] >= 1e9)
    return dict(bw_med=bwe[len(bwe) // 2], bw_max=bwe[-1], bw_max_1g=bw1, lat_max=max(abs(e) for _, _, e in errs["lat"]),
                eff_max=max(abs(e) for _, _, e in errs["eff"]))


def plot(path, p, errs, models, cp):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"resnet50": "C0", "vgg16": "C1", "bert_large": "C2"}
    pv = p.but(gamma=0.0)
    ks = [2, 3, 4, 5, 6, 7, 8, 12, 16]
    for name in ("resnet50", "vgg16", "bert_large"):
        a1.plot(ks, [harness_eff(models[name], k, 1e9, pv) for k in ks], "-" if name != "vgg16" else "--",
                color=colors[name], label="%s, model" % name)
        pts = [(r["k"], r["eff"]) for r, _, _ in errs["eff"] if r["model"] == name and r["ratio"] > 1.5]
        if pts:
            a1.plot([x for x, _ in pts], [y for _, y in pts], "o", color=colors[name], label="%s, measured" % name)
        one = [(r["k"], r["eff"]) for r, _, _ in errs["eff"] if r["model"] == name and r["ratio"] <= 1.5]
        if one:  # runs with compute = 1 x the ring's time (--compute-ms)
            a1.plot(ks, [harness_eff(models[name], k, 1e9, pv, ratio=1.0) for k in ks], ":", color=colors[name],
                    label="%s, compute = 1 x ring, model" % name)
            a1.plot([x for x, _ in one], [y for _, y in one], "s", mfc="none", color=colors[name],
                    label="%s, compute = 1 x ring, measured" % name)
    a1.set_xlabel("K nodes (1 rank each), 1 Gbit/s, compute = 2 x ring time unless marked")
    a1.set_ylabel("efficiency = compute / step")
    a1.set_ylim(0.8, 1.01)
    a1.set_title("Shaped-link cluster: measured and model")
    a1.legend(fontsize=7)
    gpus = [8, 16, 32, 64, 128, 256, 512]
    for name in WORKLOADS:
        for r, ls in ((25e9, ":"), (100e9, "--"), (400e9, "-")):
            a2.plot(gpus, [predict(name, models[name], g, r, cp, "hier")[0] for g in gpus], ls,
                    color=colors[name], label="%s, %g Gbit/s" % (name, r / 1e9))
    a2.set_xscale("log", base=2)
    a2.set_xlabel("GPUs (8 per node), kolo hierarchical")
    a2.set_ylabel("predicted efficiency")
    a2.set_ylim(0, 1.02)
    a2.set_title("Model: H100 steps (fp32 gradients)")
    a2.legend(fontsize=6, ncol=1)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    print("wrote %s" % path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "docs", "data"), help="docs/data (the stored tables)")
    ap.add_argument("--plot", metavar="PNG", nargs="?", const=os.path.join(ROOT, "docs", "img", "cluster_efficiency.png"),
                    help="write the plot (default docs/img/cluster_efficiency.png)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the error on the stored points exceeds the bounds")
    ap.add_argument("--alpha-us", type=float, default=ALPHA_NET * 1e6,
                    help="predictions: per-message latency node to node, kolo included (default %(default)g)")
    ap.add_argument("--intra-gbs", type=float, default=100.0,
                    help="predictions: local reduce over a node's GPUs, GB/s (default %(default)g)")
    a = ap.parse_args()
    bw, lat, steps = load_measurements(a.data)
    if not bw or not lat:
        print("cost_model.py: no cluster tables under %s" % a.data, file=sys.stderr)
        return 2
    models = {m: load_model(m) for m in ("resnet50", "vgg16", "bert_large")}
    p = fit(bw, lat)
    fit_kappa(p, steps, models)
    errs = check_errors(bw, lat, steps, p, models)
    cp = cluster_params(p)
    cp.alpha = cp.alpha_sw = a.alpha_us * 1e-6
    globals()["B_INTRA"] = a.intra_gbs * 1e9
    if a.check:
        s = summary(errs)
        bounds = [("busbw median", s["bw_med"], BOUND_BUSBW_MEDIAN), ("busbw max 1G", s["bw_max_1g"], BOUND_BUSBW_MAX_1G),
                  ("4 B max", s["lat_max"], BOUND_LAT_MAX), ("efficiency max", s["eff_max"], BOUND_EFF_MAX)]
        bad = [b for b in bounds if b[1] > b[2]]
        print("eta %.3f alpha %.1f us gamma %.3f ns/B c0 %.0f us alpha_sw %.1f us; %d busbw, %d 4 B, %d efficiency points"
              % (p.eta, p.alpha * 1e6, p.gamma * 1e9, p.c0 * 1e6, p.alpha_sw * 1e6, len(errs["busbw"]),
                 len(errs["lat"]), len(errs["eff"])))
        for n, v, b in bounds:
            print("%-15s |error| %5.1f%% (bound %.0f%%)%s" % (n, 100 * v, 100 * b, "  BROKEN" if v > b else ""))
        return 1 if bad else 0
    report(p, errs, models, cp)
    if a.plot:
        plot(a.plot, p, errs, models, cp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
