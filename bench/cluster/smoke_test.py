#!/usr/bin/env python3
"""smoke_test.py BUILD_DIR: ctest bench.cluster_smoke, the short shaped-link test.

Two nodes (network namespaces) behind a bridge, each link shaped to 1 Gbit/s
with tc tbf, a coordinator and one agent per node, one rank per node: a
16 MiB in-place allreduce (user memory) through bench/cluster/cluster.py.
Passes when
  - kolo's busbw (median of the slowest rank) is at least MIN_FRACTION of R,
  - every result was verified with 0 wrong elements,
  - afterwards no namespace of the run (kcl-TAG-*) is left and no process
    whose command line or environment names the run's directory is alive.
Exit 0 pass, 1 fail, 77 skipped (not root, no `ip netns`, no tbf qdisc; the
reason is printed). Everything is removed on failure too; the whole run has
a deadline of DEADLINE_S seconds (then cluster.py is stopped and the run's
namespaces removed by tag). Python 3 standard library.
"""
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.join(HERE, "cluster.py")
# busbw / R that the test requires. Measured on the 2-core development VM under the other engineers' builds
# (docs/benchmarks.md, "Cluster on one machine"): 0.79-0.92 R over 10 runs at load 5.7-7.7 (2026-11-28); the
# bound sits far below the lowest so that a loaded machine does not fail it, while a broken ring (a fallback
# through the coordinator, a stalled pipeline, a link shaped far too slow) still does.
MIN_FRACTION = 0.5
RATE = "1gbit"
SIZE = "16M"
DEADLINE_S = 35


def skip(why):
    print("bench.cluster_smoke: SKIPPED: " + why, flush=True)
    return 77


def run(cmd, timeout=10):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def preflight(tag):
    """None when namespaces and tbf work here, else the reason to skip."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            return "no %s(8) on PATH" % tool
    if run(["ip", "netns", "list"]).returncode != 0:
        return "`ip netns` does not work here"
    probe = "kcl-%s-probe" % tag
    r = run(["ip", "netns", "add", probe])
    if r.returncode != 0:
        return "cannot create a network namespace: " + r.stderr.strip()
    try:
        run(["ip", "-n", probe, "link", "set", "lo", "up"])
        r = run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", RATE, "burst", "65536",
                 "latency", "20ms"])
        if r.returncode != 0:
            return "no tbf qdisc in this kernel: " + r.stderr.strip()
    finally:
        run(["ip", "netns", "del", probe])
    return None


def leftovers(tag, run_dir):
    """Namespaces of the run still listed, and pids of processes that still name its directory."""
    ns = [l.split()[0] for l in run(["ip", "netns", "list"]).stdout.splitlines()
          if l.startswith("kcl-%s-" % tag)]
    pids = []
    needle = run_dir.encode()
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        for what in ("cmdline", "environ"):
            try:
                with open("/proc/%s/%s" % (p, what), "rb") as f:
                    if needle in f.read():
                        pids.append(int(p))
                        break
            except OSError:
                pass
    return ns, pids


def main():
    if len(sys.argv) != 2:
        print("usage: smoke_test.py BUILD_DIR", file=sys.stderr)
        return 2
    build = os.path.abspath(sys.argv[1])
    tag = "s" + secrets.token_hex(3)
    why = preflight(tag)
    if why:
        return skip(why)
    run_dir = "/tmp/kcl-" + tag
    cmd = [sys.executable, CLUSTER, "--build-dir", build, "--tag", tag, "--out", run_dir, "--nodes", "2",
           "--rates", RATE, "--delay", "0ms", "--peers", "kolo", "-b", SIZE, "-e", SIZE, "-n", "5", "-T", "2",
           "--lat-iters", "0", "--iperf-time", "0", "--timeout", "25"]
    print("bench.cluster_smoke: " + " ".join(cmd), flush=True)
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    failures = []
    try:
        out, _ = p.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        failures.append("cluster.py ran past the %d s deadline: stopped" % DEADLINE_S)
        os.killpg(p.pid, signal.SIGTERM)  # cluster.py tears down on SIGTERM
        try:
            out, _ = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
    print(out, end="", flush=True)
    if p.returncode not in (0, None) and not failures:
        failures.append("cluster.py exit %d" % p.returncode)

    try:
        with open(os.path.join(run_dir, "results.json")) as f:
            res = json.load(f)
        bw = res[0]["peers"]["kolo-ucx"]["bw"]
        size = str(int(SIZE[:-1]) << 20)
        t_us, wrong = bw[size]
        k, R = res[0]["k"], res[0]["R"]
        frac = int(size) * 8 / (t_us * 1e-6) * 2 * (k - 1) / k / R
        print("bench.cluster_smoke: K=%d, %s, 16 MiB: %.1f ms, busbw %.3f R (bound %.2f), wrong elements %d, "
              "load %s" % (k, RATE, t_us / 1e3, frac, MIN_FRACTION, wrong, res[0].get("load")), flush=True)
        if frac < MIN_FRACTION:
            failures.append("busbw %.3f R < %.2f R" % (frac, MIN_FRACTION))
        if wrong != 0:
            failures.append("%d wrong elements" % wrong)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        failures.append("no 16 MiB result (results.json: %s)" % e)

    ns, pids = leftovers(tag, run_dir)
    if ns or pids:
        failures.append("left behind: namespaces %s, processes %s" % (ns, pids))
    # Remove whatever is left, success or not (cluster.py --cleanup --tag kills by namespace, then deletes).
    subprocess.run([sys.executable, CLUSTER, "--cleanup", "--tag", tag], stdout=subprocess.DEVNULL, timeout=30)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(run_dir, ignore_errors=True)
    print("bench.cluster_smoke: %.1f s, %s" % (time.time() - t0, "FAILED: " + "; ".join(failures) if failures
                                                 else "passed"), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
