#!/usr/bin/env python3
"""head_to_head.py: kolo with default settings against Gloo and Open MPI, head to head.

kolo runs as a user runs it: kolo-bench (linked against libkolo.so, every
operation through the C ABI) launched by kolorun with the environment as
it is (no UCX_TLS, no KOLO_* knobs: default settings; --kolo-env adds some
for an A/B). The peers run in their strongest form on the same path: Open
MPI in place over shared memory (ob1, btl self,vader) on one node, Gloo's
ring over its TCP transport in place across "nodes" (loopback, or a veth
pair between two network namespaces with --veth). Each run is one program
over every size; every setting runs --repeats times, the systems
alternating (kolo first in even repeats, the peer first in odd ones), and
each figure is the median over the repeats of the run's own median of the
slowest rank's time. The 1-minute load average is printed before every
run and summarised with each table, because the machine is shared.

  bench/head_to_head.py --build-dir build --repeats 5
  bench/head_to_head.py --build-dir build --skip-across --one-node "2" -b 4 -e 4   # 4 B only
  sudo bench/head_to_head.py --build-dir build --skip-one-node --veth               # across a veth pair

Prints a markdown table per setting (time in us, busbw in GB/s, the peer's
time over kolo's = kolo's speed as a multiple of the peer's, and the spread
of that ratio over the repeats), then each head-to-head target with met /
MISSED. --markdown FILE also writes the tables with a header (date,
commit, machine, load) for docs/benchmarks.md. Exit status: 0 when every
run succeeded and verified (a missed target is reported, not a failure), 1
when a run failed or found wrong elements, 2 for bad usage or missing
programs. See docs/bench-tools.md.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

NS_A, NS_B = "kolo-h2h-a", "kolo-h2h-b"
HOST_A, HOST_B = "10.201.0.1", "10.201.0.2"


def size_arg(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    if t and t[-1] in mult:
        return int(t[:-1]) * mult[t[-1]]
    return int(t)


def human(n):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}iB" if unit else str(n)
    return f"{n} B"


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Runner:
    def __init__(self, args):
        self.a = args
        self.bin = os.path.join(args.build_dir, "bin")
        self.out = args.out or tempfile.mkdtemp(prefix="kolo-h2h.")
        os.makedirs(self.out, exist_ok=True)
        self.loads = []
        self.failed = []
        self.common = ["-b", str(args.minbytes), "-e", str(args.maxbytes), "-f", str(args.stepfactor),
                       "-w", str(args.warmup), "-n", str(args.iters), "-T", str(args.max_time),
                       "-c", "1", "--inplace"]
        self.kolo_env = self.env_with(args.kolo_env)
        self.ab_env = None
        self.ab_bin = self.bin
        if args.ab or args.ab_build_dir:
            self.ab_env = self.env_with(args.kolo_env + " " + args.ab)
        if args.ab_build_dir:
            # Each side's programs, and its own libkolo before the one in
            # kolo-bench's RUNPATH (LD_LIBRARY_PATH is searched first: a
            # copied build's kolo-bench still names the original's lib/).
            self.ab_bin = os.path.join(args.ab_build_dir, "bin")
            for env, d in ((self.kolo_env, args.build_dir), (self.ab_env, args.ab_build_dir)):
                lib = os.path.join(os.path.abspath(d), "lib")
                old = env.get("LD_LIBRARY_PATH", "")
                env["LD_LIBRARY_PATH"] = lib + (":" + old if old else "")

    @staticmethod
    def env_with(pairs):
        env = dict(os.environ)
        for kv in pairs.split():
            k, _, v = kv.partition("=")
            env[k] = v
        return env

    def run(self, tag, cmd, env=None, procs=None):
        """Runs one benchmark (cmd, or several processes `procs`); returns its rows by size."""
        load = loadavg()
        self.loads.append(load)
        js = os.path.join(self.out, tag + ".json")
        if os.path.exists(js):
            os.remove(js)
        log = os.path.join(self.out, tag + ".log")
        shown = " ".join(cmd) if procs is None else " & ".join(" ".join(p) for p in procs[:2]) + " ..."
        print(f"# {time.strftime('%H:%M:%S')} load {load:.2f}: {tag}: {shown}", flush=True)
        deadline = self.a.timeout
        with open(log, "w") as lf:
            if procs is None:
                rc = self._wait([subprocess.Popen(cmd + ["--json", js], env=env, stdout=lf,
                                                  stderr=subprocess.STDOUT)], deadline)
            else:
                ps = [subprocess.Popen(p + (["--json", js] if i == 0 else []), env=env, stdout=lf,
                                       stderr=subprocess.STDOUT) for i, p in enumerate(procs)]
                rc = self._wait(ps, deadline)
        rows = {}
        try:
            with open(js) as f:
                for r in json.load(f)["rows"]:
                    rows[int(r["size"])] = r
        except (OSError, ValueError, KeyError) as e:
            rc = rc or 1
            print(f"#   no table from {tag}: {e}")
        wrong = sum(int(r.get("wrong") or 0) for r in rows.values())
        if rc != 0 or wrong != 0:
            self.failed.append(tag)
            with open(log) as f:
                tail = f.readlines()[-15:]
            print(f"## {tag} FAILED (exit {rc}, {wrong} wrong elements):\n" + "".join(tail), flush=True)
        return rows

    @staticmethod
    def _wait(ps, limit):
        end = time.monotonic() + limit
        rc = 0
        for p in ps:
            try:
                r = p.wait(timeout=max(1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in ps:
                    q.kill()
                for q in ps:
                    q.wait()
                return 124
            rc = rc or r
        return rc

    def ns(self, i, n, cmd):
        """cmd in the namespace of rank i of n (--veth: the first half in A, the rest in B)."""
        if not self.a.veth:
            return cmd
        return ["ip", "netns", "exec", NS_A if i < n // 2 else NS_B] + cmd

    # --- the systems -------------------------------------------------------
    def kolo(self, tag, n, agents, rpa, memory, ab=False):
        args = ["-d", "float32", "-o", "sum"] + self.common + (["--zero-copy"] if memory == "shared" else [])
        bindir = self.ab_bin if ab else self.bin
        bench = [os.path.join(bindir, "kolo-bench")] + args
        if self.a.veth:
            build_dir = self.a.ab_build_dir if ab and self.a.ab_build_dir else self.a.build_dir
            cmd = [os.path.join(self.a.script_dir, "multi_agent_run.sh"), "--build-dir", build_dir,
                   "--agents", str(agents), "--ranks-per-agent", str(rpa), "--netns", f"{NS_A} {NS_B}",
                   "--coord-host", HOST_A, "--timeout", str(self.a.timeout)]
            extra = (self.a.kolo_env + " " + self.a.ab) if ab else self.a.kolo_env
            if extra.strip():
                cmd += ["--agent-env", extra.strip()]
            cmd += ["--"] + bench
        else:
            cmd = [os.path.join(bindir, "kolorun"), "-np", str(n)]
            if agents > 1:
                cmd += ["--agents", str(agents)]
            cmd += ["--"] + bench
        return self.run(tag, cmd, env=self.ab_env if ab else self.kolo_env)

    def mpi(self, tag, n):
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(n), "--mca", "pml", "ob1",
               "--mca", "btl", "self,vader", os.path.join(self.bin, "mpi-allreduce-bench")] + self.common
        return self.run(tag, cmd)

    def gloo(self, tag, n):
        store = os.path.join(self.out, tag + ".store")
        shutil.rmtree(store, ignore_errors=True)
        os.makedirs(store)
        procs = []
        for r in range(n):
            host = (HOST_A if r < n // 2 else HOST_B) if self.a.veth else "127.0.0.1"
            procs.append(self.ns(r, n, [os.path.join(self.bin, "gloo-allreduce-bench"), "--rank", str(r),
                                        "--size", str(n), "--store", store, "--host", host] + self.common))
        rows = self.run(tag, procs[0], procs=procs)
        shutil.rmtree(store, ignore_errors=True)
        return rows


def busbw(size, time_us, n):
    return size / (time_us * 1e3) * 2 * (n - 1) / n if time_us > 0 else 0.0


def summarise(title, n, series, peer, load_lo, load_hi):
    """series: {system: [rows by size, one per repeat]}; returns (markdown, {system: {size: median us}})."""
    sizes = sorted({s for runs in series.values() for rows in runs for s in rows})
    med = {}
    for sysname, runs in series.items():
        med[sysname] = {}
        for s in sizes:
            ts = [rows[s]["time_us"] for rows in runs if s in rows]
            if ts:
                med[sysname][s] = statistics.median(ts)
    lines = [f"**{title}** (N={n}; load {load_lo:.1f}-{load_hi:.1f}; median of "
             f"{max(len(r) for r in series.values())} runs each)", ""]
    # An A/B pair ("kolo M" and "kolo M (ab)"): the (ab) column's speed as a
    # multiple of the other's, per repeat (the two ran next to each other),
    # median and spread.
    ab_pairs = [k for k in series if k.endswith(" (ab)") and k[:-len(" (ab)")] in series]
    head = "| size |" + "".join(f" {k} (us) | {k} busbw |" for k in series) + "".join(
        f" {k} / {peer} | spread |" for k in series if k != peer) + "".join(
        f" {k} / {k[:-len(' (ab)')]} per repeat | spread |" for k in ab_pairs)
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for s in sizes:
        cells = [human(s)]
        for k in series:
            t = med[k].get(s)
            cells += [f"{t:.1f}" if t else "-", f"{busbw(s, t, n):.2f}" if t else "-"]
        for k in series:
            if k == peer:
                continue
            t, p = med[k].get(s), med[peer].get(s)
            ratios = [pr[s]["time_us"] / kr[s]["time_us"] for kr, pr in zip(series[k], series[peer])
                      if s in kr and s in pr and kr[s]["time_us"] > 0]
            cells += [f"{p / t:.2f}" if t and p else "-",
                      f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"]
        for k in ab_pairs:
            base = k[:-len(" (ab)")]
            ratios = [br[s]["time_us"] / ar[s]["time_us"] for br, ar in zip(series[base], series[k])
                      if s in br and s in ar and ar[s]["time_us"] > 0]
            cells += [f"{statistics.median(ratios):.2f}" if ratios else "-",
                      f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", med


def veth_up():
    if os.geteuid() != 0:
        sys.exit("head_to_head.py: --veth needs root (ip netns)")
    cmds = [["ip", "netns", "add", NS_A], ["ip", "netns", "add", NS_B],
            ["ip", "link", "add", "kh2h-a", "type", "veth", "peer", "name", "kh2h-b"],
            ["ip", "link", "set", "kh2h-a", "netns", NS_A], ["ip", "link", "set", "kh2h-b", "netns", NS_B],
            ["ip", "-n", NS_A, "addr", "add", HOST_A + "/24", "dev", "kh2h-a"],
            ["ip", "-n", NS_B, "addr", "add", HOST_B + "/24", "dev", "kh2h-b"]]
    for ns, dev in ((NS_A, "kh2h-a"), (NS_B, "kh2h-b")):
        cmds += [["ip", "-n", ns, "link", "set", "lo", "up"], ["ip", "-n", ns, "link", "set", dev, "up"]]
    for c in cmds:
        r = subprocess.run(c, capture_output=True, text=True)
        if r.returncode != 0:
            veth_down()
            sys.exit(f"head_to_head.py: {' '.join(c)}: {r.stderr.strip()}")


def veth_down():
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def targets(one_node, across):
    """The head-to-head targets against the medians; one line each."""
    out = []
    for n, med in one_node:
        k, m = med.get("kolo user"), med.get("Open MPI")
        if not k or not m:
            continue
        lo = [s for s in k if 64 << 10 <= s <= 64 << 20 and s in m]
        behind = [f"{human(s)} {k[s]:.0f} / {m[s]:.0f} us" for s in lo if k[s] > m[s]]
        out.append(f"one node N={n}, user memory >= Open MPI at 64 KiB-64 MiB: "
                   + ("met" if lo and not behind else "MISSED (" + "; ".join(behind) + ")"))
        if n == 2 and 4 in k:
            out.append(f"one node N=2, 4 B <= 10 us: {k[4]:.1f} us: " + ("met" if k[4] <= 10 else "MISSED"))
    for label, n, med in across:
        g = med.get("Gloo")
        for sysname in (x for x in med if x.startswith("kolo")):
            k = med[sysname]
            lo = [s for s in k if 1 << 20 <= s <= 64 << 20 and s in g]
            behind = [f"{human(s)} {g[s] / k[s]:.2f}x" for s in lo if g[s] / k[s] < 1.1]
            out.append(f"{label} {sysname}: busbw >= 1.1x Gloo at 1-64 MiB: "
                       + ("met" if lo and not behind else "MISSED (" + "; ".join(behind) + ")"))
            if 4 in k and 4 in g:
                out.append(f"{label} {sysname}: 4 B {k[4]:.1f} us against Gloo {g[4]:.1f}: "
                           + ("met" if k[4] <= g[4] else "MISSED"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--build-dir", default=os.path.join(os.path.dirname(here), "build"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("-b", "--minbytes", type=size_arg, default=4)
    ap.add_argument("-e", "--maxbytes", type=size_arg, default=64 << 20)
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-T", "--max-time", type=float, default=0.3)
    ap.add_argument("--one-node", default="2 4", help="rank counts on one node (default '2 4')")
    ap.add_argument("--across", default="2x1 2x2", help="KxR: K agents, R ranks each (default '2x1 2x2')")
    ap.add_argument("--memory", default="user shared", help="kolo's buffers across agents: user and/or shared")
    ap.add_argument("--veth", action="store_true", help="across agents over a veth pair between two namespaces")
    ap.add_argument("--skip-one-node", action="store_true")
    ap.add_argument("--skip-across", action="store_true")
    ap.add_argument("--kolo-env", default="", help="'K=V ...' for kolo's processes (an A/B; default: none)")
    ap.add_argument("--ab", default="", help="'K=V ...': also run kolo with these added, as its own "
                    "column 'kolo M (ab)', alternating with the rest (before/after figures in one run)")
    ap.add_argument("--ab-build-dir", default="", help="run the '(ab)' column with this build's "
                    "programs and libkolo (e.g. a copy of the build before a change: old against new "
                    "binaries in one run, interleaved); with --ab, its variables too")
    ap.add_argument("--timeout", type=int, default=600, help="per run, seconds")
    ap.add_argument("--out", default="", help="keep logs and JSON here")
    ap.add_argument("--markdown", default="", help="also write the tables and header to this file")
    a = ap.parse_args()
    a.script_dir = here
    need = ["kolorun", "kolo-bench", "kolo-agent", "kolo-coordinator"]
    need += [] if a.skip_one_node else ["mpi-allreduce-bench"]
    need += [] if a.skip_across else ["gloo-allreduce-bench"]
    for d in [a.build_dir] + ([a.ab_build_dir] if a.ab_build_dir else []):
        for p in need if d == a.build_dir else ["kolorun", "kolo-bench", "kolo-agent", "kolo-coordinator"]:
            if not os.access(os.path.join(d, "bin", p), os.X_OK):
                sys.exit(f"head_to_head.py: {d}/bin/{p} not found (build it, or pass --build-dir)")
    if not a.skip_one_node and shutil.which("mpirun") is None:
        sys.exit("head_to_head.py: mpirun not in PATH")
    if a.repeats < 1:
        sys.exit("head_to_head.py: --repeats must be >= 1")
    r = Runner(a)
    commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    start = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    header = (f"head_to_head.py {start} (commit {commit}) on {socket.gethostname()}, {os.cpu_count()} cores "
              f"({cpu}); kolo environment: {a.kolo_env or 'defaults'}"
              + (f"; 'kolo ... (ab)': with {a.ab}" if a.ab else "")
              + (f"; 'kolo ... (ab)': the programs and libkolo of {a.ab_build_dir}" if a.ab_build_dir else "")
              + "; path across agents: "
              f"{'veth between two namespaces' if a.veth else 'loopback'}; float32 sum, in place")
    print("# " + header, flush=True)
    if a.veth:
        veth_down()
        veth_up()
    docs, one_node_meds, across_meds = [], [], []
    try:
        if not a.skip_one_node:
            for n in [int(x) for x in a.one_node.split()]:
                systems = ["kolo user"] + (["kolo user (ab)"] if r.ab_env else []) + ["Open MPI"]
                series = {s: [] for s in systems}
                lo = len(r.loads)
                for rep in range(a.repeats):
                    order = systems if rep % 2 == 0 else list(reversed(systems))
                    for s in order:
                        tag = f"one-n{n}-{s.replace(' ', '-').replace('(', '').replace(')', '').lower()}-r{rep}"
                        series[s].append(r.kolo(tag, n, 1, n, "user", ab=s.endswith("(ab)"))
                                         if s.startswith("kolo") else r.mpi(tag, n))
                md, med = summarise("One node, kolo (one agent, user memory) against Open MPI (vader), in place",
                                    n, series, "Open MPI", min(r.loads[lo:]), max(r.loads[lo:]))
                print(md, flush=True)
                docs.append(md)
                one_node_meds.append((n, med))
        if not a.skip_across:
            for kr in a.across.split():
                k, rpa = (int(x) for x in kr.split("x"))
                n = k * rpa
                systems = [f"kolo {m}{x}" for m in a.memory.split() for x in ([""] + ([" (ab)"] if r.ab_env else []))]
                systems += ["Gloo"]
                series = {s: [] for s in systems}
                lo = len(r.loads)
                for rep in range(a.repeats):
                    order = systems if rep % 2 == 0 else list(reversed(systems))
                    for s in order:
                        tag = f"across-k{k}x{rpa}-{s.replace(' ', '-').replace('(', '').replace(')', '').lower()}-r{rep}"
                        series[s].append(r.gloo(tag, n) if s == "Gloo" else
                                         r.kolo(tag, n, k, rpa, s.split()[1], ab=s.endswith("(ab)")))
                label = f"K={k} agents x {rpa} rank{'s' if rpa > 1 else ''}"
                md, med = summarise(f"Across agents ({'veth' if a.veth else 'loopback'}), {label}, "
                                    "kolo against Gloo's ring (tcp), in place", n, series, "Gloo",
                                    min(r.loads[lo:]), max(r.loads[lo:]))
                print(md, flush=True)
                docs.append(md)
                across_meds.append((label, n, med))
    finally:
        if a.veth:
            veth_down()
    lines = targets(one_node_meds, across_meds)
    print("## Targets (medians of this run)")
    for ln in lines:
        print("- " + ln)
    load_note = (f"1-minute load average {min(r.loads):.1f}-{max(r.loads):.1f} over the runs"
                 + (" (under load: other work shared the cores)" if max(r.loads) >= 1.0 else ""))
    print("# " + load_note)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(header + ";\n" + load_note + ".\n\n" + "\n".join(docs) + "\nTargets:\n\n"
                    + "".join(f"- {ln}\n" for ln in lines))
    if r.failed:
        print("## FAILED runs: " + ", ".join(r.failed))
        return 1
    if not a.out:
        shutil.rmtree(r.out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
