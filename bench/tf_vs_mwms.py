#!/usr/bin/env python3
"""tf_vs_mwms.py: the TF2 synthetic benchmark on kolo against
tf.distribute.MultiWorkerMirroredStrategy, in the same run.

kolo runs Horovod's benchmark as its users run it: kolorun -np N python
examples/tensorflow2_synthetic_benchmark.py (DistributedGradientTape, kolo's
TF ops; kolorun starts the embedded coordinator and agent). The peer is
TensorFlow's own multi-worker data parallelism with its CPU collectives:
bench/tf_mwms_worker.py, the same model, per-worker batch, optimizer and
timing, N processes with TF_CONFIG on loopback ports, RING all-reduce
(CommunicationImplementation.RING; AUTO is RING on CPUs). Every setting runs
--repeats times, the systems alternating (kolo first in even repeats);
each figure is the median total img/s over the repeats. The 1-minute load
average is printed before every run and with the table, because the
machine may be shared.

  bench/tf_vs_mwms.py --build-dir build
  bench/tf_vs_mwms.py --build-dir build --models small --np 2 --repeats 3

Exit status: 0 when every run printed its figure, 1 when a run failed or
timed out, 2 for bad usage. Kept out of CI (minutes). See docs/benchmarks.md.
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOTAL = re.compile(r"Total img/sec on (\d+) CPU\(s\): ([0-9.]+) \+-([0-9.]+)")

# (model, image size, per-worker batch, warmup batches, batches per iter, iters)
MODELS = {
    "small": ("small", 32, 32, 2, 5, 3),
    "ResNet50": ("ResNet50", 224, 4, 1, 2, 2),
}


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def bench_args(model):
    name, size, batch, warm, per_iter, iters = MODELS[model]
    return ["--model", name, "--image-size", str(size), "--batch-size", str(batch),
            "--num-warmup-batches", str(warm), "--num-batches-per-iter", str(per_iter),
            "--num-iters", str(iters)]


def parse_total(text, what):
    m = TOTAL.search(text)
    if not m:
        raise RuntimeError("%s printed no 'Total img/sec' line:\n%s" % (what, text[-3000:]))
    return float(m.group(2))


def run_kolo(opts, model, n):
    cmd = [os.path.join(opts.build_dir, "bin", "kolorun"), "-np", str(n), opts.python,
           os.path.join(ROOT, "examples", "tensorflow2_synthetic_benchmark.py")] + bench_args(model)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.path.join(ROOT, "client_lib", "python"),
               KOLO_LIBRARY=os.path.join(opts.build_dir, "lib", "libkolo.so"),
               KOLO_BUILD_DIR=opts.build_dir)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=opts.timeout)
    text = res.stdout + res.stderr
    if res.returncode != 0:
        raise RuntimeError("kolo np %d %s exited %d:\n%s"
                           % (n, model, res.returncode, text[-3000:]))
    return parse_total(text, "kolo")


def run_mwms(opts, model, n):
    ports = free_ports(n)
    cluster = {"worker": ["127.0.0.1:%d" % p for p in ports]}
    procs = []
    for i in range(n):
        config = {"cluster": cluster, "task": {"type": "worker", "index": i}}
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(config))
        cmd = [opts.python, os.path.join(HERE, "tf_mwms_worker.py"),
               "--bytes-per-pack", str(opts.bytes_per_pack)] + bench_args(model)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + opts.timeout
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise RuntimeError("MWMS np %d %s: workers exited %s:\n%s"
                           % (n, model, bad, outs[bad[0][0]][-3000:]))
    return parse_total(outs[0], "MultiWorkerMirroredStrategy worker 0")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default=os.environ.get("KOLO_PYTHON", sys.executable))
    ap.add_argument("--models", default="small,ResNet50")
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--bytes-per-pack", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    opts = ap.parse_args()
    opts.build_dir = os.path.abspath(opts.build_dir)
    models = opts.models.split(",")
    sizes = [int(x) for x in opts.np.split(",")]
    if any(m not in MODELS for m in models) or not os.path.exists(
            os.path.join(opts.build_dir, "bin", "kolorun")):
        print("usage: --models from %s; %s/bin/kolorun must exist" % (list(MODELS), opts.build_dir),
              file=sys.stderr)
        return 2
    rows, loads, failed = [], [], False
    for model in models:
        for n in sizes:
            figs = {"kolo": [], "mwms": []}
            for rep in range(opts.repeats):
                order = [("kolo", run_kolo), ("mwms", run_mwms)]
                for key, fn in (order if rep % 2 == 0 else order[::-1]):
                    load = loadavg()
                    loads.append(float(load.split()[0]))
                    try:
                        v = fn(opts, model, n)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        print("FAILED %s %s np %d: %s" % (key, model, n, e), flush=True)
                        failed = True
                        continue
                    figs[key].append(v)
                    print("%s %s np %d repeat %d: %.1f img/s (loadavg before: %s)"
                          % (key, model, n, rep, v, load), flush=True)
            k = statistics.median(figs["kolo"]) if figs["kolo"] else float("nan")
            m = statistics.median(figs["mwms"]) if figs["mwms"] else float("nan")
            rows.append((model, n, k, m))
    print("\n| model | np | kolo img/s | MWMS (RING) img/s | kolo / MWMS |")
    print("|---|---|---|---|---|")
    for model, n, k, m in rows:
        name = "%s %dpx b%d" % (model, MODELS[model][1], MODELS[model][2])
        print("| %s | %d | %.1f | %.1f | %.2f |" % (name, n, k, m, k / m if m else float("nan")))
    print("\n%d cores; 1-minute load average before the runs: min %.1f, max %.1f; now %s; "
          "medians of %d repeat(s)" % (os.cpu_count(), min(loads), max(loads), loadavg(),
                                       opts.repeats))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
