#!/usr/bin/env python3
"""cluster.py: a cluster of K nodes on one machine, joined by shaped links.

Each node is a network namespace with one veth link (device `kc0`,
10.231.0.<i+1>/24) to a bridge in a hub namespace of its own; nothing is
created in the caller's namespace. Each node's link is shaped with tc netem
on both of its ends (rate R each way, half the one-way delay D on each end,
optional loss on the node's egress), so a node-to-node path costs D one way
(RTT 2D) and R in each direction, like a node behind a switch port. Where the
kernel has no netem (the development VM's), tbf shapes the rate alone and
the run says so: no added delay, no loss.

--model NAME adds kolo-bench --model-step bench/models/NAME.txt with compute
in the loop (--compute-ms, by default 2 x the ring's time for the model at
R; split over the gradients by NAME.flops where it exists, else by
parameters): efficiency = compute-only step / step with communication.

In the nodes, the way docs/operations.md runs a cluster: one kolo-coordinator
(in node 0, on its link address), one kolo-agent per node (--coordinator
ADDR, its own socket, --agent-id/--hostname nodeI), and one rank per node
(kolo-bench with KOLO_AGENT_SOCKET / KOLO_JOB_ID / KOLO_SIZE ...). The same
links then carry, in the same run: iperf3 (one stream, to check R), ping
(RTT), Gloo's ring (bench's gloo-allreduce-bench, one rank per node, bound
to the node's address) and Open MPI over TCP (mpirun in node 0, one rank
per node started through `ip netns exec`).

    sudo bench/cluster/cluster.py --build-dir build                    # K=2 4, 1 Gbit/s, 0.25 ms
    sudo bench/cluster/cluster.py --nodes "2 4 8" --rates "500mbit 1gbit" --delay 0.25ms --loss 0
    sudo bench/cluster/cluster.py --cleanup                            # remove what a killed run left

Everything it creates is named kcl-<tag>-*: namespaces (their veths, bridge
and qdiscs go with them), /tmp/kcl-<tag> (sockets, logs unless --out). It is
removed at exit, on failure and on Ctrl-C/SIGTERM; --cleanup removes every
kcl-* namespace (stopping the processes still inside) and /tmp/kcl-*.
Exit status: 0 all runs succeeded (and verified), 1 a run failed, 2 bad
usage, 77 not root / no namespaces. Python 3 standard library only.
"""
import argparse
import glob
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PREFIX = "kcl-"
SUBNET = "10.231.0"
DEV = "kc0"
# kolo's Python environment (scripts/python-env.sh): $KOLO_PYTHON, else the
# interpreter running this script.
KOLO_PYTHON = os.environ.get("KOLO_PYTHON") or sys.executable


def log(*a):
    print(*a, flush=True)


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted("signal %d" % signum)


def sh(cmd, check=True, capture=False, timeout=60):
    r = subprocess.run(cmd, shell=isinstance(cmd, str), stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (cmd if isinstance(cmd, str) else " ".join(cmd), r.returncode,
                                                r.stderr.strip()))
    return r.stdout if capture else r.returncode


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError("bad size %r" % s)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def rate_bits(s):
    m = re.fullmatch(r"([\d.]+)\s*([kmg]?)bit", s.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError("rate %r: use e.g. 500mbit, 1gbit" % s)
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def delay_ms(s):
    m = re.fullmatch(r"([\d.]+)\s*(us|ms)", s.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError("delay %r: use e.g. 0.25ms, 100us" % s)
    return float(m.group(1)) / (1000.0 if m.group(2) == "us" else 1.0)


# --- the cluster's network ----------------------------------------------------
class Net:
    """A hub namespace with a bridge and K node namespaces, each with one veth to the bridge."""

    def __init__(self, tag, k):
        self.tag, self.k = tag, k
        self.hub = "%s%s-hub" % (PREFIX, tag)
        self.nodes = ["%s%s-n%d" % (PREFIX, tag, i) for i in range(k)]
        self.made = []
        self.netem = None  # whether the kernel has netem (probed on the first link)

    def addr(self, i):
        return "%s.%d" % (SUBNET, i + 1)

    def hubdev(self, i):
        return "h%d" % i

    def up(self):
        sh(["ip", "netns", "add", self.hub])
        self.made.append(self.hub)
        sh(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        sh(["ip", "-n", self.hub, "link", "set", "lo", "up"])
        for i, ns in enumerate(self.nodes):
            sh(["ip", "netns", "add", ns])
            self.made.append(ns)
            # Both ends are created inside namespaces we own: the hub end in the hub, the peer in the node.
            sh(["ip", "-n", self.hub, "link", "add", self.hubdev(i), "type", "veth", "peer", "name", DEV,
                "netns", ns])
            sh(["ip", "-n", self.hub, "link", "set", self.hubdev(i), "master", "br0"])
            sh(["ip", "-n", self.hub, "link", "set", self.hubdev(i), "up"])
            sh(["ip", "-n", ns, "addr", "add", self.addr(i) + "/24", "dev", DEV])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            sh(["ip", "-n", ns, "link", "set", DEV, "up"])

    def shape(self, rate, delay, loss):
        """Shapes both ends of every node's link: rate R each way. With netem in the kernel also half the
        one-way delay per end and the loss on the node's egress; without it (this VM's kernel has
        CONFIG_NET_SCH_NETEM unset and no modules) tbf alone: rate only, the RTT is the veth's own."""
        half = "%.1fus" % (delay * 1000.0 / 2)
        bits = rate_bits(rate)
        burst = max(65536, int(bits / 8 * 0.001))  # >= one GSO packet, ~1 ms at R
        for i, ns in enumerate(self.nodes):
            for where, dev, extra in ((ns, DEV, ["loss", "%g%%" % loss] if loss > 0 else []),
                                      (self.hub, self.hubdev(i), [])):
                if self.netem is None:
                    self.netem = subprocess.run(["tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "netem",
                                                 "delay", "1ms"], stderr=subprocess.DEVNULL).returncode == 0
                    subprocess.run(["tc", "-n", where, "qdisc", "del", "dev", dev, "root"], stderr=subprocess.DEVNULL)
                    if not self.netem and (delay > 0 or loss > 0):
                        log("#  WARNING: no netem qdisc in this kernel: links shaped by rate only (tbf); "
                            "no added delay, no loss")
                if self.netem:
                    sh(["tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "netem", "delay", half,
                        "rate", rate, "limit", "10000"] + extra)
                else:
                    sh(["tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                        "burst", str(burst), "latency", "20ms"])

    def qdisc(self, i):
        return sh(["tc", "-n", self.nodes[i], "qdisc", "show", "dev", DEV], capture=True).strip()

    def down(self):
        for ns in reversed(self.made):
            kill_ns_pids(ns)
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        self.made = []


def kill_ns_pids(ns):
    """Stops the processes still inside a namespace this harness made (by pid)."""
    r = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pids = [int(p) for p in r.stdout.split() if p.isdigit()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGTERM and pids:
            time.sleep(1)


def cleanup_all(tag=None):
    """Removes every kcl-* namespace and /tmp/kcl-* (or only those of one run's tag)."""
    pre = PREFIX + (tag + "-" if tag else "")
    r = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    names = [l.split()[0] for l in r.stdout.splitlines() if l.startswith(pre)]
    for ns in names:
        kill_ns_pids(ns)
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        log("removed namespace", ns)
    for d in glob.glob("/tmp/" + PREFIX + (tag if tag else "*")):
        shutil.rmtree(d, ignore_errors=True)
        log("removed", d)
    return 0


# --- processes ------------------------------------------------------------------
class Procs:
    def __init__(self):
        self.live = []

    def start(self, ns, argv, env=None, out=None):
        e = dict(os.environ)
        e.update(env or {})
        f = open(out, "w") if out else subprocess.DEVNULL
        p = subprocess.Popen(["ip", "netns", "exec", ns] + argv, env=e, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        if out:
            f.close()
        self.live.append(p)
        return p

    def stop(self, procs=None, grace=5):
        procs = list(self.live if procs is None else procs)
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)  # its own group: the process we started and its children
                except ProcessLookupError:
                    pass
        deadline = time.time() + grace
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
            if p in self.live:
                self.live.remove(p)

    def wait_all(self, procs, timeout):
        deadline = time.time() + timeout
        rcs = []
        for p in procs:
            try:
                rcs.append(p.wait(max(0.1, deadline - time.time())))
            except subprocess.TimeoutExpired:
                rcs.append(124)
        self.stop(procs)
        return rcs


def wait_file(path, proc, what, logf, timeout=30):
    deadline = time.time() + timeout
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        if proc.poll() is not None or time.time() > deadline:
            tail = open(logf).read()[-2000:] if os.path.exists(logf) else ""
            raise RuntimeError("%s did not become ready; its log:\n%s" % (what, tail))
        time.sleep(0.05)
    return open(path).read().split()[0]


# --- tables ---------------------------------------------------------------------
def rows(text):
    """size -> time (us) from a kolo-bench / gloo / mpi table (8 columns, 9 with cpu-s/GB)."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0].isdigit():
            try:
                out[int(f[0])] = (float(f[4]), int(f[7]))
            except ValueError:
                pass
    return out


def busbw_bits(size, t_us, k):
    return size * 8 / (t_us * 1e-6) * 2 * (k - 1) / k


class Run:
    def __init__(self, a):
        self.a = a
        self.tag = a.tag or secrets.token_hex(3)
        self.dir = a.out or "/tmp/%s%s" % (PREFIX, self.tag)
        os.makedirs(self.dir, exist_ok=True)
        self.bin = os.path.join(a.build_dir, "bin")
        self.procs = Procs()
        self.net = None
        self.status = 0
        self.results = []  # dicts

    def fail(self, what, logf):
        self.status = 1
        tail = open(logf).read()[-1500:] if os.path.exists(logf) else ""
        log("## FAILED: %s (log %s)\n%s" % (what, logf, tail))

    # -- daemons
    def start_daemons(self, k, backend):
        net, d = self.net, self.dir
        clog = os.path.join(d, "coordinator.log")
        cready = os.path.join(d, "coord.ready")
        for f in glob.glob(os.path.join(d, "*.ready")):
            os.remove(f)
        c = self.procs.start(net.nodes[0], [self.bin + "/kolo-coordinator", "--listen", net.addr(0) + ":0",
                                            "--ready-file", cready], out=clog)
        coord = wait_file(cready, c, "kolo-coordinator", clog)
        agents = []
        for i, ns in enumerate(net.nodes):
            env = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": DEV, "KOLO_METRICS_LISTEN": "127.0.0.1:0",
                   "KOLO_BACKEND": backend, "KOLO_BACKEND_TCP_ADDRESS": net.addr(i)}
            env.update(dict(kv.split("=", 1) for kv in self.a.agent_env.split()))
            alog = os.path.join(d, "agent-%d.log" % i)
            nice = ["nice", "-n", str(self.a.agent_nice)] if self.a.agent_nice else []
            agents.append((self.procs.start(ns, nice + [self.bin + "/kolo-agent", "--socket", "%s/node%d.sock" % (d, i),
                                                 "--coordinator", coord, "--rpc-listen", "127.0.0.1:0",
                                                 "--ready-file", "%s/node%d.ready" % (d, i),
                                                 "--agent-id", "node%d" % i, "--hostname", "node%d" % i],
                                           env=env, out=alog), alog))
        for i, (p, alog) in enumerate(agents):
            wait_file("%s/node%d.ready" % (d, i), p, "kolo-agent node%d" % i, alog)
        return [c] + [p for p, _ in agents]

    def kolo_job(self, k, name, args, extra_env=None):
        job = "cl-%s-%s" % (self.tag, name)
        ranks = []
        for i, ns in enumerate(self.net.nodes):
            env = {"KOLO_AGENT_SOCKET": "%s/node%d.sock" % (self.dir, i), "KOLO_JOB_ID": job,
                   "KOLO_JOB_TOKEN": "t-" + job, "KOLO_SIZE": str(k), "KOLO_LOCAL_RANK": "0",
                   "KOLO_LOCAL_SIZE": "1", "KOLO_START_TIMEOUT": "60"}
            env.update(extra_env or {})
            ranks.append(self.procs.start(ns, [self.bin + "/kolo-bench"] + args, env=env,
                                          out="%s/%s-rank%d.log" % (self.dir, name, i)))
        rcs = self.procs.wait_all(ranks, self.a.timeout)
        logf = "%s/%s-rank0.log" % (self.dir, name)
        if any(rcs):
            self.fail("kolo %s exit %s" % (name, rcs), logf)
        return open(logf).read()

    def gloo_job(self, k, name, args):
        store = os.path.join(self.dir, "store-" + name)
        shutil.rmtree(store, ignore_errors=True)
        os.makedirs(store)
        ranks = [self.procs.start(ns, [self.bin + "/gloo-allreduce-bench", "--rank", str(i), "--size", str(k),
                                       "--store", store, "--host", self.net.addr(i)] + args,
                                  out="%s/%s-rank%d.log" % (self.dir, name, i))
                 for i, ns in enumerate(self.net.nodes)]
        rcs = self.procs.wait_all(ranks, self.a.timeout)
        shutil.rmtree(store, ignore_errors=True)
        logf = "%s/%s-rank0.log" % (self.dir, name)
        if any(rcs):
            self.fail("gloo %s exit %s" % (name, rcs), logf)
        return open(logf).read()

    def mpi_job(self, k, name, args):
        prog = [self.bin + "/mpi-allreduce-bench"] + args
        argv = ["env", "PMIX_MCA_ptl_tcp_if_include=" + DEV, "PMIX_MCA_ptl_tcp_remote_connections=1",
                "mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "pml", "ob1", "--mca", "btl",
                "self,tcp", "--mca", "btl_tcp_if_include", DEV, "--mca", "oob_tcp_if_include", DEV]
        for i, ns in enumerate(self.net.nodes):
            if i:
                argv.append(":")
            argv += ["-np", "1"] + (prog if i == 0 else ["ip", "netns", "exec", ns] + prog)
        logf = "%s/%s.log" % (self.dir, name)
        p = self.procs.start(self.net.nodes[0], argv, out=logf)
        rc = self.procs.wait_all([p], self.a.timeout)[0]
        if rc:
            self.fail("mpi %s exit %d" % (name, rc), logf)
        return "\n".join(l for l in open(logf).read().splitlines() if not l.startswith("["))

    # -- link checks
    PINGPONG = r"""
import socket, statistics, sys, time
role, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role == "s":
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind((host, port)); l.listen(1)
    print("listening", flush=True); c, _ = l.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(1)
        if not b: break
        c.sendall(b)
else:
    c = socket.create_connection((host, port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ts = []
    for i in range(n):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); ts.append(time.perf_counter() - t)
    print("%.4f" % (statistics.median(ts[n // 10:]) * 1e3))
"""

    def ping_rtt_ms(self):
        """Median round trip of 1 byte over TCP (TCP_NODELAY) between node1 and node0, Python at both ends
        (no ping(8) here): the link's RTT plus two wake-ups on this machine."""
        port = "5302"
        logf = self.dir + "/pingpong-s.log"
        srv = self.procs.start(self.net.nodes[0], [sys.executable, "-c", self.PINGPONG, "s", self.net.addr(0), port,
                                                   "0"], out=logf)
        deadline = time.time() + 10
        while "listening" not in open(logf).read() and time.time() < deadline and srv.poll() is None:
            time.sleep(0.05)
        out = sh(["ip", "netns", "exec", self.net.nodes[1], sys.executable, "-c", self.PINGPONG, "c",
                  self.net.addr(0), port, "1000"], capture=True, check=False)
        self.procs.stop([srv])
        try:
            return float(out.split()[-1])
        except (ValueError, IndexError, AttributeError):
            return None

    def iperf_mbit(self):
        if not shutil.which("iperf3") or self.a.iperf_time <= 0:
            return None
        port = "5301"
        srv = self.procs.start(self.net.nodes[0], ["iperf3", "-s", "-1", "-B", self.net.addr(0), "-p", port],
                               out=self.dir + "/iperf-s.log")
        time.sleep(0.5)
        out = sh(["ip", "netns", "exec", self.net.nodes[1], "iperf3", "-c", self.net.addr(0), "-p", port, "-t",
                  str(self.a.iperf_time), "-J"], capture=True, check=False, timeout=self.a.iperf_time + 30)
        self.procs.stop([srv])
        try:
            return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
        except Exception:
            return None

    # -- one K
    def run_k(self, k):
        a = self.a
        self.net = Net(self.tag, k)
        log("\n# K=%d: namespaces %s .. %s, bridge br0 in %s" % (k, self.net.nodes[0], self.net.nodes[-1],
                                                                   self.net.hub))
        self.net.up()
        try:
            for rate in a.rates:
                self.net.shape(rate, a.delay, a.loss)
                R = rate_bits(rate)
                log("## K=%d, link %s, delay %.3f ms one way, loss %g%%: %s" % (k, rate, a.delay, a.loss,
                                                                              self.net.qdisc(0)))
                rtt = self.ping_rtt_ms()
                ip = self.iperf_mbit()
                log("#  TCP ping-pong RTT node1->node0 %s ms; iperf3 one stream %s Mbit/s; load %s" % (
                    rtt, "%.0f" % ip if ip else "n/a", open("/proc/loadavg").read().split()[0]))
                res = {"k": k, "rate": rate, "R": R, "rtt_ms": rtt, "iperf_mbit": ip, "peers": {},
                       "load": open("/proc/loadavg").read().split()[0]}
                bw = ["-b", a.minbytes, "-e", a.maxbytes, "-f", "2", "-w", "1", "-n", str(a.iters), "-T",
                      str(a.max_time), "-c", "1"] + ([] if a.out_of_place else ["--inplace"])
                lat = ["-b", "4", "-e", "4", "-w", "5", "-n", str(a.lat_iters), "-T", "2", "-c", "1"]
                rtag = "k%d-%s" % (k, rate)
                zc = ["--zero-copy"] if a.zero_copy else []
                for peer in a.peers:
                    if peer == "kolo":
                        for be in a.kolo_backends:
                            daemons = self.start_daemons(k, be)
                            try:
                                lt = rows(self.kolo_job(k, "kolo-%s-lat-%s" % (be, rtag), lat)) if a.lat_iters else {}
                                bt = rows(self.kolo_job(k, "kolo-%s-bw-%s" % (be, rtag), bw + ["-d", "float32"] + zc))
                            finally:
                                self.procs.stop(daemons)
                            res["peers"]["kolo-" + be] = (lt, bt)
                    elif peer == "gloo":
                        lt = rows(self.gloo_job(k, "gloo-lat-" + rtag, lat)) if a.lat_iters else {}
                        bt = rows(self.gloo_job(k, "gloo-bw-" + rtag, bw))
                        res["peers"]["gloo"] = (lt, bt)
                    elif peer == "mpi":
                        if not shutil.which("mpirun") or not os.path.exists(self.bin + "/mpi-allreduce-bench"):
                            log("#  MPI skipped: mpirun or mpi-allreduce-bench missing")
                            continue
                        lt = rows(self.mpi_job(k, "mpi-lat-" + rtag, lat)) if a.lat_iters else {}
                        bt = rows(self.mpi_job(k, "mpi-bw-" + rtag, bw))
                        res["peers"]["mpi"] = (lt, bt)
                    self.report(res, only=peer)
                if a.model:
                    self.model_step(k, rate, R, rtag, res)
                self.results.append(res)
        finally:
            self.procs.stop()
            self.net.down()
            self.net = None

    def model_step(self, k, rate, R, rtag, res):
        """kolo-bench --model-step with compute in the loop: the step's efficiency = compute-only / step."""
        a = self.a
        mfile = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", a.model + ".txt")
        params = sum(int(l.split()[1]) for l in open(mfile) if l.strip() and not l.startswith("#"))
        ring_ms = 2 * (k - 1) / k * params * 4 * 8 / R * 1e3  # the ring's time for the model's gradients at R
        compute = 2 * ring_ms if a.compute_ms == "auto" else float(a.compute_ms)
        res.setdefault("model", {})
        prof = mfile[:-4] + ".flops"
        pargs = ["--compute-profile", prof] if a.profile == "flops" and os.path.exists(prof) else []
        if "ddp" in a.model_peers:
            self.ddp_model_step(k, mfile, pargs, compute, ring_ms, rtag, res)
        for be in a.kolo_backends if "kolo" in a.model_peers else []:
            for fusion, env in a.fusion_modes:
                env = env.replace("DIR", self.dir)
                self.a.agent_env, saved = (a.agent_env + " " + env).strip(), a.agent_env
                daemons = self.start_daemons(k, be)
                self.a.agent_env = saved
                name = "model-%s-%s-%s-%s" % (a.model, be, fusion, rtag)
                try:
                    envs = dict(kv.split("=", 1) for kv in env.split())
                    out = self.kolo_job(k, name, ["--model-step", mfile, "--compute-ms", "%.1f" % compute, "-w",
                                                  str(a.model_warmup),
                                                  "-n", str(a.model_iters), "-T", "0", "-c", "1"] + pargs
                                        + (["--zero-copy"] if a.zero_copy else []),
                                        extra_env=envs)
                finally:
                    self.procs.stop(daemons)
                m = re.search(r"compute-only step ([\d.]+) us, step with communication ([\d.]+) us: scaling "
                              r"efficiency ([\d.]+)", out)
                row = [l.split() for l in out.splitlines() if l.strip().startswith(a.model)]
                flat_us = float(row[0][8]) if row and len(row[0]) >= 12 else None
                if m:
                    key = "%s-%s%s" % (be, fusion, "-zc" if a.zero_copy else "")
                    res["model"][key] = {"compute_ms": compute, "ring_ms": ring_ms,
                                                           "compute_only_us": float(m.group(1)),
                                                           "step_us": float(m.group(2)),
                                                           "efficiency": float(m.group(3)), "flat_us": flat_us}
                    res["model"][key]["profile"] = "flops" if pargs else "params"
                    log("#  model step %s (compute by %s), kolo-%s, fusion %s%s: compute %.0f ms (%.2f x the ring's %.0f ms "
                        "at R), step %.0f ms, flat allreduce alone %s ms: efficiency %.3f" % (
                            a.model, "flops" if pargs else "params", be, fusion,
                            ", kolo_alloc_shared" if a.zero_copy else "", compute, compute / ring_ms, ring_ms,
                            float(m.group(2)) / 1e3,
                            "%.0f" % (flat_us / 1e3) if flat_us else "-", float(m.group(3))))

    def ddp_model_step(self, k, mfile, pargs, compute, ring_ms, rtag, res):
        """The same step as PyTorch DDP on Gloo does it (ddp_model_step.py: 1 + 25 MiB buckets, one rank per node)."""
        a = self.a
        name = "model-%s-ddp-%s" % (a.model, rtag)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_model_step.py")
        init = "tcp://%s:29511" % self.net.addr(0)
        ranks = [self.procs.start(ns, [KOLO_PYTHON, script, "--model", mfile, "--compute-ms", "%.1f" % compute,
                                       "--rank", str(i), "--size", str(k), "--init", init, "-w", str(a.model_warmup),
                                       "-n", str(a.model_iters)] + pargs,
                                  env={"GLOO_SOCKET_IFNAME": DEV, "OMP_NUM_THREADS": "1"},
                                  out="%s/%s-rank%d.log" % (self.dir, name, i))
                 for i, ns in enumerate(self.net.nodes)]
        rcs = self.procs.wait_all(ranks, a.timeout)
        logf = "%s/%s-rank0.log" % (self.dir, name)
        out = open(logf).read() if os.path.exists(logf) else ""
        if any(rcs):
            self.fail("ddp %s exit %s" % (name, rcs), logf)
        m = re.search(r"compute-only step ([\d.]+) us, step with communication ([\d.]+) us: scaling "
                      r"efficiency ([\d.]+)", out)
        if m:
            res["model"]["ddp-gloo"] = {"compute_ms": compute, "ring_ms": ring_ms, "compute_only_us": float(m.group(1)),
                                        "step_us": float(m.group(2)), "efficiency": float(m.group(3)),
                                        "flat_us": None, "profile": "flops" if pargs else "params"}
            log("#  model step %s (compute by %s), ddp-gloo (25 MiB buckets): compute %.0f ms (%.2f x the ring's %.0f "
                "ms at R), step %.0f ms: efficiency %.3f" % (a.model, "flops" if pargs else "params", compute,
                                                             compute / ring_ms, ring_ms,
                                                          float(m.group(2)) / 1e3, float(m.group(3))))

    def report(self, res, only=None):
        k, R, rtt = res["k"], res["R"], res["rtt_ms"]
        for name, (lt, bt) in res["peers"].items():
            if only and not name.startswith(only):
                continue
            l = lt.get(4, (None, 0))[0]
            cells = []
            for s in sorted(bt):
                t, wrong = bt[s]
                bb = busbw_bits(s, t, k)
                cells.append("%dM %.0f Mbit/s (%.2f R)%s" % (s >> 20, bb / 1e6, bb / R, " WRONG" if wrong else ""))
            log("#  %-9s 4 B: %s us%s | busbw %s" % (
                name, "%.0f" % l if l else "n/a", " = %.1f RTT" % (l / 1000 / rtt) if l and rtt else "",
                "; ".join(cells) or "n/a"))

    def summary(self):
        peers = []
        for r in self.results:
            for p in r["peers"]:
                if p not in peers:
                    peers.append(p)
        sizes = sorted({s for r in self.results for p in r["peers"].values() for s in p[1]})
        if peers:
            log("\n## Summary: busbw in units of the link rate R (median of the slowest rank), 4-byte allreduce "
                "in RTTs")
        hdr = "| K | R | RTT us | iperf3 | peer | " + " | ".join("%d MiB" % (s >> 20) for s in sizes) + \
              " | 4 B us | 4 B RTTs |"
        if peers:
            log(hdr)
            log("|" + "---|" * (hdr.count("|") - 1))
        for r in self.results:
            for p in peers:
                if p not in r["peers"]:
                    continue
                lt, bt = r["peers"][p]
                l = lt.get(4, (None,))[0]
                cells = ["%.2f" % (busbw_bits(s, bt[s][0], r["k"]) / r["R"]) if s in bt else "-" for s in sizes]
                log("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
                    r["k"], r["rate"], "%.0f" % (r["rtt_ms"] * 1000) if r["rtt_ms"] else "-",
                    "%.0f" % r["iperf_mbit"] if r["iperf_mbit"] else "-", p, " | ".join(cells),
                    "%.0f" % l if l else "-", "%.1f" % (l / 1000 / r["rtt_ms"]) if l and r["rtt_ms"] else "-"))
        if any(r.get("model") for r in self.results):
            log("\n## Model step (%s): efficiency = compute-only step / step with communication" % self.a.model)
            log("| K | R | kolo backend-fusion | compute by | compute ms | flat allreduce ms | step ms | efficiency |")
            log("|---|---|---|---|---|---|---|---|")
            for r in self.results:
                for cfg, m in r.get("model", {}).items():
                    log("| %d | %s | %s | %s | %.0f | %s | %.0f | %.3f |" % (
                        r["k"], r["rate"], cfg, m["profile"], m["compute_only_us"] / 1e3,
                        "%.0f" % (m["flat_us"] / 1e3) if m["flat_us"] else "-", m["step_us"] / 1e3, m["efficiency"]))
        with open(os.path.join(self.dir, "results.json"), "w") as f:
            json.dump([{**r, "peers": {p: {"lat": v[0], "bw": v[1]} for p, v in r["peers"].items()}}
                       for r in self.results], f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build", help="build tree with bin/kolo-agent ... (default ./build)")
    ap.add_argument("--nodes", default="2 4", help='node counts K (default "2 4")')
    ap.add_argument("--rates", default="1gbit", help='link rates, tc syntax (default "1gbit")')
    ap.add_argument("--delay", default="0.25ms", help="one-way node-to-node delay (default 0.25ms: RTT 0.5 ms)")
    ap.add_argument("--loss", type=float, default=0.0, help="loss in %% on each node's egress (default 0)")
    ap.add_argument("--peers", default="kolo gloo mpi", help='what to run (default "kolo gloo mpi")')
    ap.add_argument("--kolo-backends", default="ucx", help='kolo agent backends, "ucx" and/or "tcp" (default ucx)')
    ap.add_argument("--zero-copy", action="store_true",
                    help="kolo-bench --zero-copy: tensors in the agent's arena (as Gloo and MPI use the caller's buffer), also for --model")
    ap.add_argument("--out-of-place", action="store_true",
                    help="bandwidth runs out of place (separate input and output); default: in place on every "
                         "side (kolo-bench --inplace, Gloo without an input, MPI_IN_PLACE)")
    ap.add_argument("--model", help="also run kolo-bench --model-step with bench/models/MODEL.txt (e.g. resnet50)")
    ap.add_argument("--compute-ms", default="auto",
                    help="backward compute per step for --model (default auto: 2 x the ring's time for the "
                         "model at R, so that its allreduce is about 50%% of the compute)")
    ap.add_argument("--fusion", default="default",
                    help='fusion settings for --model: "default" (128 MiB), "off" (KOLO_FUSION_THRESHOLD_MB=0) and/or '
                         '"autotune" (agents with KOLO_AUTOTUNE=1, the samples in autotune-AGENT.csv under --out; '
                         'give it --model-warmup steps to settle)')
    ap.add_argument("--model-peers", default="kolo",
                    help='who runs --model: "kolo" and/or "ddp" (ddp_model_step.py: DDP\'s 25 MiB buckets on '
                         'torch.distributed gloo, $KOLO_PYTHON with torch)')
    ap.add_argument("--model-warmup", type=int, default=1, help="untimed steps first for --model (default 1)")
    ap.add_argument("--profile", default="flops", choices=["flops", "params"],
                    help="--model's compute per gradient: by the layer's forward FLOPs (bench/models/MODEL.flops, "
                         "default where it exists) or by its parameter count")
    ap.add_argument("--model-iters", type=int, default=3, help="timed steps for --model (default 3)")
    ap.add_argument("--agent-env", default="", help='extra "K=V ..." for the agents')
    ap.add_argument("--agent-nice", type=int, default=0,
                    help="run the agents under nice -n N (e.g. -5: the agents' threads before the "
                         "trainers' copies, as a systemd unit's Nice= would; default 0)")
    ap.add_argument("-b", "--minbytes", default="16M")
    ap.add_argument("-e", "--maxbytes", default="256M")
    ap.add_argument("-n", "--iters", type=int, default=3, help="timed iterations per size (default 3)")
    ap.add_argument("-T", "--max-time", type=float, default=1.0, help="bench's -T (default 1)")
    ap.add_argument("--lat-iters", type=int, default=50, help="timed 4-byte allreduces (default 50; 0: none)")
    ap.add_argument("--iperf-time", type=int, default=2, help="iperf3 seconds (default 2; 0: no iperf3)")
    ap.add_argument("--timeout", type=int, default=300, help="per job, seconds (default 300)")
    ap.add_argument("--out", help="keep logs and results.json here (default: /tmp/kcl-TAG, removed)")
    ap.add_argument("--tag", help="name the run's namespaces kcl-TAG-* (default: random hex; letters and digits, "
                                  "at most 8)")
    ap.add_argument("--cleanup", action="store_true",
                    help="remove every kcl-* namespace and /tmp/kcl-* (with --tag: that run's only), then exit")
    a = ap.parse_args()
    if os.geteuid() != 0:
        log("cluster.py: SKIPPED: needs root (ip netns, tc)")
        return 77
    if a.tag is not None and not re.fullmatch(r"[A-Za-z0-9]{1,8}", a.tag):
        log("cluster.py: bad arguments: --tag %r: letters and digits, at most 8" % a.tag)
        return 2
    if a.cleanup:
        return cleanup_all(a.tag)
    try:
        a.nodes = [int(x) for x in a.nodes.split()]
        a.rates = a.rates.split()
        for r in a.rates:
            rate_bits(r)
        a.delay = delay_ms(a.delay)
        parse_size(a.minbytes), parse_size(a.maxbytes)
        a.peers = a.peers.split()
        a.kolo_backends = a.kolo_backends.split()
        fm = {"default": "", "off": "KOLO_FUSION_THRESHOLD_MB=0",
              "autotune": "KOLO_AUTOTUNE=1 KOLO_AUTOTUNE_LOG_FILE=DIR/autotune-%a.csv"}
        a.model_peers = a.model_peers.split()
        assert set(a.model_peers) <= {"kolo", "ddp"}
        a.fusion_modes = [(f, fm[f]) for f in a.fusion.split()]
        if a.compute_ms != "auto":
            float(a.compute_ms)
        assert all(k >= 2 for k in a.nodes) and max(a.nodes) < 250
        assert set(a.peers) <= {"kolo", "gloo", "mpi"} and set(a.kolo_backends) <= {"ucx", "tcp"}
    except (argparse.ArgumentTypeError, ValueError, AssertionError, KeyError) as e:
        log("cluster.py: bad arguments: %s" % (e or "see --help"))
        return 2
    if not os.path.exists(os.path.join(a.build_dir, "bin", "kolo-agent")):
        log("cluster.py: %s/bin/kolo-agent not found (--build-dir)" % a.build_dir)
        return 2
    a.build_dir = os.path.abspath(a.build_dir)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    run = Run(a)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    log("# cluster.py %s: %s, %d cores (%s), load %s; tag %s, logs %s" % (
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), os.uname().nodename, os.cpu_count(), cpu,
        " ".join(open("/proc/loadavg").read().split()[:3]), run.tag, run.dir))
    log("# nodes %s; links %s, %.3f ms one way, loss %g%%; kolo: coordinator in node0, one agent per node "
        "(backends %s, UCX_TLS=tcp UCX_NET_DEVICES=%s), one rank per node%s; allreduce %s" % (
            a.nodes, a.rates, a.delay, a.loss, a.kolo_backends, DEV, ", --zero-copy" if a.zero_copy else "",
            "out of place" if a.out_of_place else "in place"))
    try:
        for k in a.nodes:
            run.run_k(k)
        run.summary()
    except Interrupted as e:
        log("cluster.py: interrupted (%s); tearing down" % e)
        run.status = 130
    except Exception as e:  # noqa: BLE001 (report, tear down, fail)
        log("cluster.py: FAILED: %s" % e)
        run.status = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        run.procs.stop()
        if run.net:
            run.net.down()
        if not a.out:
            shutil.rmtree(run.dir, ignore_errors=True)
    return run.status


if __name__ == "__main__":
    sys.exit(main())
