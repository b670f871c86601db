#!/usr/bin/env python3
"""Runs what the Kubernetes manifests run, as they run it, twice.

For each workload of deploy/kubernetes/base (the coordinator Deployment,
then the agent DaemonSet), in a sandbox per pod:

  * every init container's command, then every container's (the image's
    ENTRYPOINT, mapped to the built binaries, plus its args), each under the
    user, group, fsGroup and capabilities of its securityContext (setpriv:
    uid/gid, supplementary groups, bounding and inheritable capability
    sets, no_new_privs when allowPrivilegeEscalation is false);
  * volumes are directories: a hostPath or a PersistentVolumeClaim lives
    across the two runs (the node's /run/kolo, the coordinator's state), an
    emptyDir is fresh each run, a ConfigMap's keys and the admin token
    Secret are files (the Secret's defaultMode, group fsGroup);
  * mount paths, ports (7470-7472, per node but for the coordinator's) and the coordinator's Service name are
    rewritten to the sandbox, free loopback ports and 127.0.0.1, in the
    commands, the environment and the ConfigMap files;
  * a daemon must become ready (its socket or port) within 30 s, its
    preStop hook must succeed, and SIGTERM must stop it within 1 s with
    exit code 0.

Then the training Job of deploy/kubernetes/training: the agent DaemonSet
has a pod on each of two stand-in nodes (each its own /run/kolo hostPath),
and the Job's pods (one per node, as its anti-affinity places them) run
their container's command -- the kolo-launch ConfigMap script, then the
image's /usr/bin/kolo-demo, mapped to the built one -- as the manifest runs
it: user, groups, fsGroup-owned token Secret file, downward-API fields
(the Job's name and uid). Every rank must report a correct allreduce, every
pod must exit 0, the coordinator must list the job FINISHED with all its
ranks, and the token (the Secret's value) must never be on any process's
command line while they run.

Each daemon's probes are made once it is ready, as the kubelet makes them:
httpGet as plain HTTP, grpc as a plain-text gRPC call to the same server
(the kolo CLI without the container's TLS settings: the kubelet's gRPC
probe does not speak TLS), exec in the container.

Once the daemons are up, what an operator runs with `kubectl exec` runs in
their containers, with the containers' environment: `kolo agents` (the
coordinator's and an agent's) must list every node, `kolo status` (an
agent's) must answer.

Then everything again for deploy/kubernetes/overlays/tls, rendered with
kubectl kustomize (skipped, with a note, without kubectl or openssl), with
a CA and certificate made by openssl as the kolo-tls Secret: TLS between
the agents and the coordinator, /healthz probes, preStop over TLS. And
for overlays/mtls, with a client certificate of the same CA as the
kolo-client-tls Secret: mutual TLS everywhere, and the refusals: `kolo
agents` / `kolo status` in the pods without the client certificate, or
with one of another CA, and an agent pod without its client certificate,
must fail with "cannot reach the kolo coordinator/agent at ..." /
"cannot register with the coordinator at ..." and the hint that names
--coordinator-cert/--agent-cert.

The second run is the point: a pod that restarts on the same node (the
init container finds the directory it prepared before, the agent finds its
old socket) must work as the first did.

Needs root (to become the pods' users) and setpriv; otherwise it says why
and exits 0 with "SKIPPED".
"""

import argparse
import copy
import os
import re
import secrets
import shutil
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import json
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import validate_deploy as vd  # noqa: E402

IMAGE_ENTRYPOINTS = {"kolo-agent": "kolo-agent", "kolo-coordinator": "kolo-coordinator"}
PORTS = (7470, 7471, 7472)
READY_TIMEOUT_S = 30
STOP_BOUND_S = 1.0
TRAIN_TIMEOUT_S = 60
NODES = 2  # agents (DaemonSet pods) on as many stand-in nodes, for the training Job


_TAKEN = set()


def free_port():
    """A free port below the kernel's ephemeral range: a port the kernel
    handed out with bind(0) is in that range, and any outgoing connection
    (the daemons' gRPC clients among them) may take it as its source port
    before the daemon meant to listen there binds it ("Address already in
    use" seen on a loaded machine)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(1000):
        port = rng.randrange(10000, max(10001, low))
        if port in _TAKEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _TAKEN.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range (%d)" % low)


class Sandbox:
    """Directories standing for the pods' volumes and the rewrites into them."""

    def __init__(self, root, node="node-1", cluster=None):
        self.root = root
        self.node = node
        os.chmod(root, 0o755)
        self.ports = {p: free_port() for p in PORTS}
        if cluster is not None:  # another node: the same coordinator Service
            self.ports[7470] = cluster.ports[7470]
        # hostPath: ("hostPath", path), per node; PVC: (workload, volume); across runs.
        self.persistent = {}
        # Secrets by name: one value per cluster, whichever pod mounts them.
        self.secrets = cluster.secrets if cluster is not None else {}
        # Secrets given as files (the TLS case's kolo-tls), by name.
        self.secret_files = cluster.secret_files if cluster is not None else {}

    def rewrite(self, text, mounts):
        # One pass, whole path components only, longest first (/etc/kolo-admin
        # before /etc/kolo): a sandbox path under /tmp is not rewritten again.
        if mounts:
            alts = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
            text = re.sub(rf"(?<![\w./-])({alts})(?![\w.-])", lambda m: mounts[m.group(1)], text)
        for old, new in self.ports.items():
            text = text.replace(f":{old}", f":{new}")
        text = text.replace("0.0.0.0:", "127.0.0.1:").replace("kolo-coordinator:", "127.0.0.1:")
        return text


def volume_dirs(sandbox, wid, spec, run, configmaps, fs_group):
    """name -> directory for every volume of the pod, for this run."""
    dirs = {}
    for v in spec.get("volumes") or []:
        name = v["name"]
        if "hostPath" in v or "persistentVolumeClaim" in v:
            # The node's directory, whichever pod mounts it (the agent's
            # /run/kolo is the trainers' /run/kolo).
            key = ("hostPath", v["hostPath"]["path"]) if "hostPath" in v else (wid, name)
            if key not in sandbox.persistent:
                d = tempfile.mkdtemp(prefix=f"{name}-", dir=sandbox.root)
                if "hostPath" in v:  # DirectoryOrCreate: root:root 0755, made by the kubelet
                    os.chown(d, 0, 0)
                    os.chmod(d, 0o755)
                else:  # a volume with fsGroup: group-owned, setgid
                    os.chown(d, 0, fs_group or 0)
                    os.chmod(d, 0o2775)
                sandbox.persistent[key] = d
            dirs[name] = sandbox.persistent[key]
            continue
        d = tempfile.mkdtemp(prefix=f"{name}-{run}-", dir=sandbox.root)
        if "emptyDir" in v:
            os.chmod(d, 0o1777 if fs_group is None else 0o2777)
            if fs_group is not None:
                os.chown(d, 0, fs_group)
        elif "configMap" in v:
            os.chmod(d, 0o755)
            dirs[name] = d
            cm = configmaps[v["configMap"]["name"]]
            for key, text in (cm.get("data") or {}).items():
                dirs.setdefault("__configmap_files__", []).append((os.path.join(d, key), text))
            continue
        elif "secret" in v:
            os.chmod(d, 0o755)
            # Created by the operator (the admin token: docs/operations.md; a
            # training job's token: docs/kubernetes.md): one value per Secret.
            sname = v["secret"]["secretName"]
            files = sandbox.secret_files.get(sname)
            if files is None:
                value = sandbox.secrets.setdefault(sname, secrets.token_hex(32))
                files = {"token": value + "\n"}
            for key, text in files.items():
                path = os.path.join(d, key)
                with open(path, "w") as f:
                    f.write(text)
                os.chown(path, 0, fs_group or 0)
                os.chmod(path, v["secret"].get("defaultMode", 0o644))
        dirs[name] = d
    return dirs


def setpriv_argv(pod_sc, sc):
    """setpriv arguments for a container's securityContext (and the pod's)."""
    uid = sc.get("runAsUser", pod_sc.get("runAsUser", vd.KOLO_UID))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", vd.KOLO_UID))  # the image's USER
    groups = [g for g in [pod_sc.get("fsGroup")] + list(pod_sc.get("supplementalGroups") or [])
              if g is not None]
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        raise ValueError("a container that does not drop ALL capabilities")
    added = [c.lower() for c in caps.get("add") or []]
    capset = "-all" + "".join(f",+{c}" for c in added)
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}",
            f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
            f"--bounding-set={capset}", f"--inh-caps={capset}"]
    if sc.get("allowPrivilegeEscalation") is False:
        argv.append("--no-new-privs")
    return argv + ["--"]


def program_argv(c, bins, rewrite):
    """The container's command: its command, else the image's ENTRYPOINT, plus args."""
    image = c["image"].split(":")[0].rsplit("/", 1)[-1]
    command = list(c.get("command") or [])
    if not command:
        # The image's ENTRYPOINT is the built binary itself: a path of this
        # machine, never rewritten into the pod's volumes (a build under /tmp
        # is not the pod's emptyDir /tmp).
        return [bins[IMAGE_ENTRYPOINTS[image]]] + [rewrite(a) for a in c.get("args") or []]
    # An image path (/usr/bin/X) is the built X; anything else is the pod's.
    return [bins.get(os.path.basename(a), a) if a.startswith("/usr/bin/") else rewrite(a)
            for a in command + list(c.get("args") or [])]


def run_probe(probe, sandbox, bins, priv, env, rewrite):
    """One probe, as the kubelet makes it: an HTTP GET (plain HTTP), a
    gRPC health check (plain-text gRPC: the kubelet's does not speak TLS;
    here a plain-text call to the same server through the kolo CLI, with
    none of the container's TLS settings), or an exec in the container.
    None when it passes, else why."""
    if "httpGet" in probe:
        g = probe["httpGet"]
        url = f"http://127.0.0.1:{sandbox.ports.get(g['port'], g['port'])}{g.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=probe.get("timeoutSeconds", 1)) as r:
                return None if 200 <= r.status < 400 else f"GET {url}: {r.status}"
        except (OSError, urllib.error.HTTPError) as e:
            return f"GET {url}: {e}"
    if "grpc" in probe:
        port = probe["grpc"]["port"]
        addr = f"127.0.0.1:{sandbox.ports.get(port, port)}"
        argv = ([bins["kolo"], "status", "--agent", addr] if port == 7471 else
                [bins["kolo"], "jobs", "--coordinator", addr])
        rc, out = vd.run_tool(argv, env={"PATH": "/usr/bin:/bin"})
        return None if rc == 0 else f"plain-text gRPC to {addr}: exit {rc}: {out.strip()[:300]}"
    if "exec" in probe:
        argv = priv + [bins.get(os.path.basename(a), a) if a.startswith("/usr/bin/") else rewrite(a)
                       for a in probe["exec"]["command"]]
        rc, out = vd.run_tool(argv, env=env)
        return None if rc == 0 else f"exec: exit {rc}: {out.strip()[:300]}"
    return f"unknown probe {probe}"


def make_tls(d):
    """A CA, the servers' certificate for the names the TLS overlays'
    daemons use (extendedKeyUsage serverAuth: the kolo-tls Secret's files),
    a client certificate of the same CA (clientAuth: the kolo-client-tls
    Secret of overlays/mtls), and a client certificate of another CA (for
    the refusals; other-client.crt/.key in d). Returns {Secret: {key: text}}."""
    def ssl(*args):
        rc, out = vd.run_tool(["openssl", *args])
        if rc != 0:
            raise RuntimeError(f"openssl {args[0]}: {out}")

    def path(n):
        return os.path.join(d, n)

    def ca(name, cn):
        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", path(f"{name}.key"),
            "-out", path(f"{name}.crt"), "-days", "2", "-subj", f"/CN={cn}")

    def cert(name, cn, ca_name, ext):
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", path(f"{name}.key"),
            "-out", path(f"{name}.csr"), "-subj", f"/CN={cn}")
        with open(path(f"{name}.ext"), "w") as f:
            f.write(ext)
        ssl("x509", "-req", "-in", path(f"{name}.csr"), "-CA", path(f"{ca_name}.crt"),
            "-CAkey", path(f"{ca_name}.key"), "-CAcreateserial", "-out", path(f"{name}.crt"),
            "-days", "2", "-extfile", path(f"{name}.ext"))

    ca("ca", "kolo test CA")
    ca("other-ca", "another CA")
    cert("tls", "kolo-coordinator", "ca",
         "subjectAltName=DNS:kolo-coordinator,DNS:kolo-coordinator.kolo-system.svc,"
         "DNS:kolo-agent\nextendedKeyUsage=serverAuth\n")
    cert("client", "kolo-agent", "ca", "extendedKeyUsage=clientAuth\n")
    cert("other-client", "kolo-agent", "other-ca", "extendedKeyUsage=clientAuth\n")

    def read(n):
        with open(path(n)) as f:
            return f.read()
    return {"kolo-tls": {"tls.crt": read("tls.crt"), "tls.key": read("tls.key"),
                         "ca.crt": read("ca.crt")},
            "kolo-client-tls": {"tls.crt": read("client.crt"), "tls.key": read("client.key")}}


def wait_ready(proc, c, rewrite):
    """The daemon's socket (agent) or TCP port (coordinator) answers."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    port = next((p.get("containerPort") for p in c.get("ports") or []), None)
    target = rewrite(f":{port}").lstrip(":") if port else None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with {proc.returncode} before it was ready"
        try:
            with socket.create_connection(("127.0.0.1", int(target)), timeout=0.5):
                return None
        except OSError:
            time.sleep(0.05)  # bounded poll: nothing to wait on for a TCP port
    return f"not ready within {READY_TIMEOUT_S} s"


def pod_env(c, rewrite, env_base, sandbox, fields):
    env = dict(env_base)
    # The pod's IP: the sandbox's pods share loopback.
    fields = dict(fields, **{"status.podIP": fields.get("status.podIP", "127.0.0.1")})
    defined = {}
    for e in c.get("env") or []:
        if "value" in e:
            # Kubernetes expands $(VAR) with the variables defined before it.
            value = re.sub(r"\$\((\w+)\)", lambda m: defined.get(m.group(1), m.group(0)), str(e["value"]))
            env[e["name"]] = rewrite(value)
            defined[e["name"]] = env[e["name"]]
            continue
        if e["name"] == "KOLO_HOSTNAME":
            env[e["name"]] = sandbox.node
        else:
            path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if path not in fields:
                raise ValueError(f"{c['name']}: no stand-in for {e['name']} ({path})")
            env[e["name"]] = fields[path]
        defined[e["name"]] = env[e["name"]]
    return env


def prepare_pod(w, sandbox, run, configmaps):
    """The pod's volumes (and its ConfigMap files) for this run."""
    wid = vd.object_id(w)
    spec = vd.pod_spec(w)
    pod_sc = spec.get("securityContext") or {}
    dirs = volume_dirs(sandbox, wid, spec, run, configmaps, pod_sc.get("fsGroup"))

    def mounts_of(c):
        return {m["mountPath"]: dirs[m["name"]] for m in c.get("volumeMounts") or []}

    all_mounts = {}
    for c in vd.containers_of(w, init=True):
        all_mounts.update(mounts_of(c))
    for path, text in dirs.get("__configmap_files__", []):
        # Every container of the pod mounts the ConfigMap at the same place.
        with open(path, "w") as f:
            f.write(sandbox.rewrite(text, all_mounts))
        os.chmod(path, 0o644)
    return dirs, mounts_of


def run_init_containers(w, sandbox, run, bins, mounts_of, env_base, errors):
    """The pod's init containers, in order; False (and why in errors) when one fails."""
    wid = vd.object_id(w)
    spec = vd.pod_spec(w)
    pod_sc = spec.get("securityContext") or {}
    for c in spec.get("initContainers") or []:
        name = f"{wid}[{c['name']}] on {sandbox.node} run {run}"
        rewrite = lambda t, m=mounts_of(c): sandbox.rewrite(t, m)  # noqa: E731
        argv = setpriv_argv(pod_sc, c.get("securityContext") or {}) + program_argv(c, bins, rewrite)
        rc, out = vd.run_tool(argv, env=env_base)
        if rc != 0:
            errors.append(f"{name}: exit {rc}: {out.strip()}")
            return False
    return True


def run_pod(w, sandbox, run, bins, configmaps, started, errors, logs, state):
    wid = vd.object_id(w)
    spec = vd.pod_spec(w)
    pod_sc = spec.get("securityContext") or {}
    env_base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KOLO_LOG_LEVEL": "warn"}
    dirs, mounts_of = prepare_pod(w, sandbox, run, configmaps)
    if not run_init_containers(w, sandbox, run, bins, mounts_of, env_base, errors):
        return False

    for c in spec.get("containers") or []:
        name = f"{wid}[{c['name']}] on {sandbox.node} run {run}"
        mounts = mounts_of(c)
        rewrite = lambda t, m=mounts: sandbox.rewrite(t, m)  # noqa: E731
        priv = setpriv_argv(pod_sc, c.get("securityContext") or {})
        env = pod_env(c, rewrite, env_base, sandbox, {})
        log = open(os.path.join(sandbox.root, f"{c['name']}-{sandbox.node}-{run}.log"), "w")
        logs.append(log.name)
        proc = subprocess.Popen(priv + program_argv(c, bins, rewrite), env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc)
        why = wait_ready(proc, c, rewrite)
        if why:
            errors.append(f"{name}: {why}; log {log.name}")
            return False
        # As the kubelet: the startup probe (else the readiness probe) may
        # fail until failureThreshold x periodSeconds (polled faster here);
        # then the readiness and liveness probes must pass, where the
        # kubelet, too, acts only after failureThreshold failures in a row
        # (one probe that times out on a loaded machine is not a failure).
        first = "startupProbe" if c.get("startupProbe") else "readinessProbe"
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c.get(kind)
            if not probe:
                continue
            tries = probe.get("failureThreshold", 3)
            bound = tries * probe.get("periodSeconds", 10)
            deadline = time.monotonic() + (min(bound, READY_TIMEOUT_S) if kind == first else 0)
            while True:
                why = run_probe(probe, sandbox, bins, priv, env, rewrite)
                tries -= 1
                if not why or (time.monotonic() >= deadline and tries <= 0):
                    break
                time.sleep(0.05 if kind == first else 0.5)  # bounded: the failure budget
            if why:
                errors.append(f"{name}: {kind} fails: {why}")
        pre = (((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
        state.append({"proc": proc, "name": name, "priv": priv, "rewrite": rewrite, "env": env,
                      "prestop": pre, "sandbox": sandbox,
                      "component": vd.labels_of(w).get(vd.LABEL_COMPONENT)})
    return True


def stop_pod(state, bins, errors):
    for st in reversed(state):
        proc, name, rewrite, pre = st["proc"], st["name"], st["rewrite"], st["prestop"]
        if pre:
            argv = st["priv"] + [bins.get(os.path.basename(a), a) if a.startswith("/usr/bin/")
                                 else rewrite(a) for a in pre]
            rc, out = vd.run_tool(argv, env=st["env"])
            if rc != 0:
                errors.append(f"{name}: preStop exit {rc}: {out.strip()}")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            errors.append(f"{name}: still running 10 s after SIGTERM")
            continue
        took = time.monotonic() - t0
        if took > STOP_BOUND_S:
            errors.append(f"{name}: SIGTERM took {took:.2f} s (bound {STOP_BOUND_S} s)")
        if rc != 0:
            errors.append(f"{name}: exit code {rc} after SIGTERM")


def cmdlines():
    """pid -> command line of every process on the machine."""
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    out[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass  # gone meanwhile
    return out


def job_size(job):
    """Ranks of a training Job: its pods x KOLO_SLOTS."""
    slots = next((e["value"] for c in vd.pod_spec(job)["containers"] for e in c.get("env") or []
                  if e["name"] == "KOLO_SLOTS"), "1")
    return int(job["spec"].get("parallelism", 1)) * int(slots)


def run_job(job, sandboxes, run, bins, configmaps, started, errors, logs):
    """A training Job: its pods (one per node, as its anti-affinity places
    them), each container run as the manifest runs it, all at once, against
    the nodes' agents. Every pod must exit 0 within TRAIN_TIMEOUT_S; the job
    token must be on no command line meanwhile. Returns the kolo job id."""
    wid = vd.object_id(job)
    spec = vd.pod_spec(job)
    pods = int(job["spec"].get("parallelism", 1))
    if pods != int(job["spec"].get("completions", pods)):
        errors.append(f"{wid}: parallelism != completions: the ranks of a kolo job start together")
        return None
    if pods > len(sandboxes):
        errors.append(f"{wid}: {pods} pods, the test has {len(sandboxes)} nodes")
        return None
    pod_sc = spec.get("securityContext") or {}
    env_base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KOLO_LOG_LEVEL": "warn"}
    job_uid = str(uuid.uuid4())
    procs, token = [], None
    for index in range(pods):
        sandbox = sandboxes[index]
        dirs, mounts_of = prepare_pod(job, sandbox, run, configmaps)
        for v in spec.get("volumes") or []:
            if "secret" in v:
                token = sandbox.secrets[v["secret"]["secretName"]]
        fields = {"metadata.labels['batch.kubernetes.io/job-name']": job["metadata"]["name"],
                  "metadata.labels['batch.kubernetes.io/controller-uid']": job_uid,
                  "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index)}
        for c in spec.get("containers") or []:
            name = f"{wid}[{c['name']}] pod {index} on {sandbox.node} run {run}"
            rewrite = lambda t, m=mounts_of(c): sandbox.rewrite(t, m)  # noqa: E731
            argv = setpriv_argv(pod_sc, c.get("securityContext") or {}) + \
                program_argv(c, bins, rewrite)
            env = pod_env(c, rewrite, env_base, sandbox, fields)
            env["KOLO_START_TIMEOUT"] = str(TRAIN_TIMEOUT_S)  # fail within the test's bound
            log = open(os.path.join(sandbox.root, f"{c['name']}-{index}-{run}.log"), "w")
            logs.append(log.name)
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            started.append(proc)
            procs.append((name, proc, log.name))
    if not token:
        errors.append(f"{wid}: mounts no Secret (the job token)")
    deadline = time.monotonic() + TRAIN_TIMEOUT_S
    leaked = set()
    while time.monotonic() < deadline and any(p.poll() is None for _, p, _ in procs):
        if token:
            leaked |= {f"pid {pid}: {line.replace(token, '<the token>')}"
                       for pid, line in cmdlines().items() if token in line}
        time.sleep(0.02)  # bounded poll: sampling command lines while the ranks run
    for name, proc, log in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            errors.append(f"{name}: still running after {TRAIN_TIMEOUT_S} s; log {log}")
        elif proc.returncode != 0:
            errors.append(f"{name}: exit {proc.returncode}; log {log}")
    for line in sorted(leaked):
        errors.append(f"{wid}: the job token is on a command line: {line}")
    job_id = f"{job['metadata']['name']}-{job_uid}"
    ranks = 0
    for _, _, log in procs:
        with open(log) as f:
            text = f.read()
        ranks += len(re.findall(r"^rank \d+/\d+: result check passed ", text, re.M))
        if token and token in text:
            errors.append(f"{wid}: the job token is in a pod's output ({log})")
    if not errors and ranks != job_size(job):
        errors.append(f"{wid}: {ranks} ranks reported a correct allreduce, want {job_size(job)}")
    return job_id


def check_job_finished(bins, sandbox, job_id, size, errors, tls):
    """The coordinator saw the job: FINISHED, with all its ranks."""
    argv = [bins["kolo"], "jobs", "--json", "--coordinator", f"127.0.0.1:{sandbox.ports[7470]}"]
    if tls:  # make_tls's files, next to the sandboxes
        argv += ["--coordinator-ca", os.path.join(sandbox.root, "ca.crt"),
                 "--coordinator-server-name", "kolo-coordinator"]
    if tls == "mtls":
        argv += ["--coordinator-cert", os.path.join(sandbox.root, "client.crt"),
                 "--coordinator-key", os.path.join(sandbox.root, "client.key")]
    rc, out = vd.run_tool(argv, env={"PATH": "/usr/bin:/bin"})
    if rc != 0:
        errors.append(f"kolo jobs: exit {rc}: {out.strip()}")
        return
    try:
        jobs = json.loads(out)
    except ValueError:
        errors.append(f"kolo jobs --json: not JSON: {out[:500]}")
        return
    jobs = jobs.get("jobs", jobs) if isinstance(jobs, dict) else jobs
    mine = [j for j in jobs if j.get("job_id") == job_id]
    if not mine:
        errors.append(f"the coordinator has no job {job_id}: {out[:1000]}")
        return
    j = mine[0]
    if j.get("state") not in ("FINISHED", "finished") or int(j.get("world_size", 0)) != size:
        errors.append(f"job {job_id}: {j}, want FINISHED with world size {size}")


def exec_kolo(st, bins, args, drop=(), extra=None):
    """`kubectl exec POD -- kolo ARGS` in the container of pod state st: its
    user, capabilities and environment (less the names in drop, plus
    extra). The pod's loopback is the sandbox's: KOLO_AGENT_RPC and, where
    the container sets no KOLO_COORDINATOR, KOLO_COORDINATOR point there."""
    sandbox = st["sandbox"]
    env = {k: v for k, v in st["env"].items() if k not in drop}
    env.setdefault("KOLO_COORDINATOR", f"127.0.0.1:{sandbox.ports[7470]}")
    env["KOLO_AGENT_RPC"] = f"127.0.0.1:{sandbox.ports[7471]}"
    env.update(extra or {})
    return vd.run_tool(st["priv"] + [bins["kolo"]] + list(args), env=env)


def expect_refused(what, rc, out, wants, errors):
    """A client that must be refused: exit non-zero, every text of wants in
    its message."""
    if rc == 0:
        errors.append(f"{what}: accepted (exit 0), want refused: {out.strip()[:500]}")
        return
    missing = [w for w in wants if w not in out]
    if missing:
        errors.append(f"{what}: exit {rc} without {missing} in: {out.strip()[:800]}")


CLIENT_CERT_ENV = {"coordinator": ("KOLO_COORDINATOR_CERT", "KOLO_COORDINATOR_KEY"),
                   "agent": ("KOLO_AGENT_CERT", "KOLO_AGENT_KEY")}
CLIENT_CERT_HINT = "whether the server requires a client certificate (--{0}-cert/--{0}-key)"


def check_execs(label, up, run, bins, tls, errors):
    """What an operator runs in the pods (`kubectl exec ... kolo ...`) works
    with the containers' own settings; under mutual TLS, a client without a
    certificate, or with one of another CA, is refused with a message that
    says why."""
    states = [st for state in up for st in state]
    coord = next((st for st in states if st["component"] == "coordinator"), None)
    agents = [st for st in states if st["component"] == "agent"]
    if coord is None or not agents:
        errors.append(f"{label}: no coordinator or agent pod to exec in")
        return
    nodes = sorted(st["sandbox"].node for st in agents)
    for st, args in [(coord, ["agents"]), (agents[0], ["agents"]), (agents[0], ["status"])]:
        rc, out = exec_kolo(st, bins, args)
        if rc != 0:
            errors.append(f"{label} run {run}: exec in {st['name']}: kolo {' '.join(args)}: "
                          f"exit {rc}: {out.strip()[:800]}")
        elif args == ["agents"] and not all(n in out for n in nodes):
            errors.append(f"{label} run {run}: exec in {st['name']}: kolo agents lists not "
                          f"all of {nodes}: {out.strip()[:800]}")
    if tls != "mtls":
        return
    root = coord["sandbox"].root
    other = {"coordinator": {"KOLO_COORDINATOR_CERT": os.path.join(root, "other-client.crt"),
                             "KOLO_COORDINATOR_KEY": os.path.join(root, "other-client.key")},
             "agent": {"KOLO_AGENT_CERT": os.path.join(root, "other-client.crt"),
                       "KOLO_AGENT_KEY": os.path.join(root, "other-client.key")}}
    for st, peer, args, port in [(coord, "coordinator", ["agents"], 7470),
                                 (agents[0], "agent", ["status"], 7471)]:
        where = f"127.0.0.1:{st['sandbox'].ports[port]}"
        wants = [f"cannot reach the kolo {peer} at {where}", CLIENT_CERT_HINT.format(peer)]
        rc, out = exec_kolo(st, bins, args, drop=CLIENT_CERT_ENV[peer])
        expect_refused(f"{label} run {run}: kolo {args[0]} without a client certificate",
                       rc, out, wants, errors)
        if rc != 0 and out.strip():
            print(f"{label} run {run}: kolo {args[0]} without a client certificate: exit {rc}: "
                  f"{out.strip().splitlines()[-1]}")
        rc, out = exec_kolo(st, bins, args, extra=other[peer])
        expect_refused(f"{label} run {run}: kolo {args[0]} with a client certificate of "
                       "another CA", rc, out, wants[:1], errors)


def run_refused_agent(w, first, root, run, bins, configmaps, started, errors, logs):
    """The agent DaemonSet's pod on another node, its container without the
    client certificate (KOLO_COORDINATOR_CERT/KEY): the coordinator of
    overlays/mtls refuses it, and it exits non-zero saying why."""
    w = copy.deepcopy(w)
    spec = vd.pod_spec(w)
    c = next(c for c in spec["containers"] if c["name"] == "agent")
    c["env"] = [e for e in c["env"] if e["name"] not in CLIENT_CERT_ENV["coordinator"]]
    # Handshake failures are retried until register-timeout-s: not 30 s here.
    c["env"].append({"name": "KOLO_REGISTER_TIMEOUT_S", "value": "3"})
    sandbox = Sandbox(root, "node-without-cert", cluster=first)
    env_base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KOLO_LOG_LEVEL": "warn"}
    _, mounts_of = prepare_pod(w, sandbox, run, configmaps)
    if not run_init_containers(w, sandbox, run, bins, mounts_of, env_base, errors):
        return
    rewrite = lambda t, m=mounts_of(c): sandbox.rewrite(t, m)  # noqa: E731
    argv = setpriv_argv(spec.get("securityContext") or {}, c.get("securityContext") or {}) + \
        program_argv(c, bins, rewrite)
    env = pod_env(c, rewrite, env_base, sandbox, {})
    log = os.path.join(sandbox.root, f"agent-without-cert-{run}.log")
    logs.append(log)
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    started.append(proc)
    try:
        rc = proc.wait(timeout=READY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        errors.append(f"agent without a client certificate: still running after "
                      f"{READY_TIMEOUT_S} s (want refused); log {log}")
        return
    with open(log) as f:
        out = f.read()
    where = f"127.0.0.1:{sandbox.ports[7470]}"
    expect_refused(f"run {run}: an agent without a client certificate", rc, out,
                   [f"cannot register with the coordinator at {where}",
                    CLIENT_CERT_HINT.format("coordinator")], errors)
    if rc != 0:
        line = next((ln for ln in out.splitlines() if "cannot register" in ln), "")
        print(f"overlays/mtls run {run}: an agent without a client certificate: exit {rc}: "
              f"{line.strip()[:400]}")


def check_socket_dir(sandbox, errors):
    for (kind, path), d in sandbox.persistent.items():
        if (kind, path) != ("hostPath", "/run/kolo"):
            continue
        st = os.stat(d)
        if (st.st_uid, st.st_gid, st.st_mode & 0o7777) != (vd.KOLO_UID, vd.KOLO_UID, 0o755):
            errors.append(f"{sandbox.node} {path}: {st.st_uid}:{st.st_gid} "
                          f"{oct(st.st_mode & 0o7777)}, "
                          f"want {vd.KOLO_UID}:{vd.KOLO_UID} 0o755")


def run_cluster(label, workloads, jobs, configmaps, bins, root, secret_files, started, errors,
                logs, tls=None):
    """Runs the workloads (and then the training Jobs) twice, as pods on
    NODES stand-in nodes; checks the CLI in the pods (and, tls "mtls", the
    refusals); stops them; checks the node directories."""
    first = Sandbox(root)
    first.secret_files.update(secret_files)
    sandboxes = [first] + [Sandbox(root, f"node-{i}", cluster=first) for i in range(2, NODES + 1)]
    # Pods of other workloads (the coordinator) have their own network
    # namespace: their own ports (but the coordinator's, which is the
    # cluster's), on a node of their own.
    control = Sandbox(root, "node-0", cluster=first)
    for run in (1, 2):
        up = []  # pod states, in start order
        ok = True
        for w in workloads:
            # A DaemonSet's pod on every node; other workloads on the first.
            for sandbox in sandboxes if w.get("kind") == "DaemonSet" else [control]:
                state = []
                ok = run_pod(w, sandbox, run, bins, configmaps, started, errors, logs, state)
                up.append(state)
                if not ok:
                    break
            if not ok:
                break
        if ok and not errors:
            check_execs(label, up, run, bins, tls, errors)
        if ok and not errors and tls == "mtls" and run == 1:
            agent = next(w for w in workloads if w.get("kind") == "DaemonSet")
            run_refused_agent(agent, first, root, run, bins, configmaps, started, errors, logs)
        for job in jobs if ok and not errors else []:
            job_id = run_job(job, sandboxes, run, bins, configmaps, started, errors, logs)
            if job_id and not errors:
                check_job_finished(bins, first, job_id, job_size(job), errors, tls)
                print(f"{label} run {run}: {vd.object_id(job)}: kolo job {job_id}: "
                      f"{'ok' if not errors else 'FAILED'}")
        for state in reversed(up):
            stop_pod(state, bins, errors)
        for sandbox in sandboxes + [control]:
            check_socket_dir(sandbox, errors)
        print(f"{label} run {run}: {'ok' if not errors else 'FAILED'}")
        if errors:
            break


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--bin", action="append", default=[], metavar="NAME=PATH")
    a = ap.parse_args()
    bins = dict(b.partition("=")[::2] for b in a.bin)
    if os.geteuid() != 0:
        print("SKIPPED: not root: cannot run the containers as their users")
        return 0
    if shutil.which("setpriv") is None:
        print("SKIPPED: setpriv is not installed")
        return 0
    missing = [n for n in ("kolo", "kolo-agent", "kolo-coordinator") if not os.access(bins.get(n, ""), os.X_OK)]
    if missing:
        print(f"SKIPPED: not built: {missing}")
        return 0
    _, kustomizations = vd.check_kustomizations(a.root)
    _, objs = vd.base_objects(a.root, kustomizations)
    configmaps = {o["metadata"]["name"]: o for o in objs if o.get("kind") == "ConfigMap"}
    order = {"coordinator": 0, "agent": 1}
    workloads = sorted((o for o in objs if o.get("kind") in vd.WORKLOAD_KINDS),
                       key=lambda o: order.get(vd.labels_of(o).get(vd.LABEL_COMPONENT), 9))
    jobs = [o for o in objs if o.get("kind") == "Job"]
    # The trainers' program (an image's /usr/bin/...) must be built to run them.
    programs = {os.path.basename(a) for j in jobs for c in vd.pod_spec(j).get("containers") or []
                for a in (c.get("command") or []) + (c.get("args") or []) if a.startswith("/usr/bin/")}
    unbuilt = sorted(p for p in programs if not os.access(bins.get(p, ""), os.X_OK))
    if jobs and unbuilt:
        print(f"note: training Job not run: not built: {unbuilt}")
        jobs = []
    errors, logs, started = [], [], []
    root = tempfile.mkdtemp(prefix="kolo-pods-")
    try:
        run_cluster("base", workloads, jobs, configmaps, bins, root, {}, started, errors, logs)
        tls_secrets = None
        for overlay in ("tls", "mtls"):
            rendered, why = vd.render_kustomization(os.path.join(a.root, "deploy", "kubernetes",
                                                                  "overlays", overlay))
            if errors:
                break
            if rendered is None:
                print(f"note: overlays/{overlay} not run: {why}")
                continue
            if shutil.which("openssl") is None:
                print(f"note: overlays/{overlay} not run: openssl is not installed")
                continue
            tls_root = tempfile.mkdtemp(prefix=f"{overlay}-", dir=root)
            tls_secrets = make_tls(tls_root)
            for n in ("other-client.crt", "other-client.key"):  # read by the pods' users
                os.chmod(os.path.join(tls_root, n), 0o644)
            if overlay == "tls":
                tls_secrets.pop("kolo-client-tls")
            tls_cms = dict(configmaps)
            tls_cms.update({o["metadata"]["name"]: o for o in rendered
                            if o.get("kind") == "ConfigMap"})
            tls_workloads = sorted((o for o in rendered if o.get("kind") in vd.WORKLOAD_KINDS),
                                   key=lambda o: order.get(vd.labels_of(o).get(vd.LABEL_COMPONENT),
                                                           9))
            run_cluster(f"overlays/{overlay}", tls_workloads, jobs, tls_cms, bins, tls_root,
                        tls_secrets, started, errors, logs, tls=overlay)
    finally:
        for p in started:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if errors:
            for log in logs:
                with open(log) as f:
                    tail = f.read()[-2000:]
                print(f"--- {log}\n{tail}")
        shutil.rmtree(root, ignore_errors=True)
    for e in errors:
        print(f"FAIL {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
