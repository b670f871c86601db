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
  * mount paths, ports (7470-7472) and the coordinator's Service name are
    rewritten to the sandbox, free loopback ports and 127.0.0.1, in the
    commands, the environment and the ConfigMap files;
  * a daemon must become ready (its socket or port) within 30 s, its
    preStop hook must succeed, and SIGTERM must stop it within 1 s with
    exit code 0.

The second run is the point: a pod that restarts on the same node (the
init container finds the directory it prepared before, the agent finds its
old socket) must work as the first did.

Needs root (to become the pods' users) and setpriv; otherwise it says why
and exits 0 with "SKIPPED".
"""

import argparse
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import validate_deploy as vd  # noqa: E402

IMAGE_ENTRYPOINTS = {"kolo-agent": "kolo-agent", "kolo-coordinator": "kolo-coordinator"}
PORTS = (7470, 7471, 7472)
READY_TIMEOUT_S = 30
STOP_BOUND_S = 1.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sandbox:
    """Directories standing for the pods' volumes and the rewrites into them."""

    def __init__(self, root):
        self.root = root
        os.chmod(root, 0o755)
        self.ports = {p: free_port() for p in PORTS}
        self.persistent = {}  # (workload, volume) -> dir, across runs

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
            key = (wid, name)
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
            # The admin token Secret: created by the operator (docs/operations.md).
            path = os.path.join(d, "token")
            with open(path, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
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
        command = [bins[IMAGE_ENTRYPOINTS[image]]]
    argv = [rewrite(a) for a in command + list(c.get("args") or [])]
    return [bins.get(os.path.basename(a), a) if a.startswith("/usr/bin/") else a for a in argv]


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


def run_pod(w, sandbox, run, bins, configmaps, started, errors, logs):
    wid = vd.object_id(w)
    spec = vd.pod_spec(w)
    pod_sc = spec.get("securityContext") or {}
    fs_group = pod_sc.get("fsGroup")
    dirs = volume_dirs(sandbox, wid, spec, run, configmaps, fs_group)
    env_base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KOLO_LOG_LEVEL": "warn"}

    def mounts_of(c):
        return {m["mountPath"]: dirs[m["name"]] for m in c.get("volumeMounts") or []}

    for path, text in dirs.get("__configmap_files__", []):
        # Every container of the pod mounts the ConfigMap at the same place.
        all_mounts = {}
        for c in vd.containers_of(w, init=True):
            all_mounts.update(mounts_of(c))
        with open(path, "w") as f:
            f.write(sandbox.rewrite(text, all_mounts))
        os.chmod(path, 0o644)

    for c in spec.get("initContainers") or []:
        name = f"{wid}[{c['name']}] run {run}"
        rewrite = lambda t, m=mounts_of(c): sandbox.rewrite(t, m)  # noqa: E731
        argv = setpriv_argv(pod_sc, c.get("securityContext") or {}) + program_argv(c, bins, rewrite)
        rc, out = vd.run_tool(argv, env=env_base)
        if rc != 0:
            errors.append(f"{name}: exit {rc}: {out.strip()}")
            return False

    for c in spec.get("containers") or []:
        name = f"{wid}[{c['name']}] run {run}"
        mounts = mounts_of(c)
        rewrite = lambda t, m=mounts: sandbox.rewrite(t, m)  # noqa: E731
        priv = setpriv_argv(pod_sc, c.get("securityContext") or {})
        env = dict(env_base)
        for e in c.get("env") or []:
            if "value" in e:
                env[e["name"]] = rewrite(str(e["value"]))
            elif e["name"] == "KOLO_HOSTNAME":
                env[e["name"]] = "node-1"
        log = open(os.path.join(sandbox.root, f"{c['name']}-{run}.log"), "w")
        logs.append(log.name)
        proc = subprocess.Popen(priv + program_argv(c, bins, rewrite), env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc)
        why = wait_ready(proc, c, rewrite)
        if why:
            errors.append(f"{name}: {why}; log {log.name}")
            return False
        pre = (((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
        c.setdefault("__prestop__", pre)
        c["__proc__"] = proc
        c["__name__"] = name
        c["__priv__"] = priv
        c["__rewrite__"] = rewrite
        c["__env__"] = env
    return True


def stop_pod(w, bins, errors):
    for c in reversed(vd.pod_spec(w).get("containers") or []):
        proc = c.pop("__proc__", None)
        if proc is None:
            continue
        name, rewrite = c.pop("__name__"), c.pop("__rewrite__")
        pre = c.get("__prestop__")
        if pre:
            argv = c["__priv__"] + [bins.get(os.path.basename(a), a) if a.startswith("/usr/bin/")
                                    else rewrite(a) for a in pre]
            rc, out = vd.run_tool(argv, env=c["__env__"])
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


def check_socket_dir(sandbox, errors):
    for (wid, vname), d in sandbox.persistent.items():
        if vname != "run-kolo":
            continue
        st = os.stat(d)
        if (st.st_uid, st.st_gid, st.st_mode & 0o7777) != (vd.KOLO_UID, vd.KOLO_UID, 0o755):
            errors.append(f"{wid} {vname}: {st.st_uid}:{st.st_gid} {oct(st.st_mode & 0o7777)}, "
                          f"want {vd.KOLO_UID}:{vd.KOLO_UID} 0o755")


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
    errors, logs, started = [], [], []
    root = tempfile.mkdtemp(prefix="kolo-pods-")
    try:
        sandbox = Sandbox(root)
        for run in (1, 2):
            up = []
            for w in workloads:
                if not run_pod(w, sandbox, run, bins, configmaps, started, errors, logs):
                    break
                up.append(w)
            for w in reversed(up):
                stop_pod(w, bins, errors)
            check_socket_dir(sandbox, errors)
            print(f"run {run}: {'ok' if not errors else 'FAILED'}")
            if errors:
                break
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
