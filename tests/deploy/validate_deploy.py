#!/usr/bin/env python3
"""Validates kolo's deployment files (deploy/).

  systemd   deploy/systemd/*.service: `systemd-analyze verify` on copies whose
            ExecStart points at stub executables, `systemd-analyze security
            --offline` against an exposure ceiling, the properties kolo needs
            (Type=notify, --config, Restart, RuntimeDirectory, hardening...),
            and the sysusers snippet through `systemd-sysusers --root`.
  config    deploy/config/*.conf.example and the ConfigMaps' embedded files:
            syntax, the knobs that must be documented, cross-file ports; with
            --bin NAME=PATH (the built daemons) also every documented knob and
            default against the daemon's own `--dump-config`.
  k8s       deploy/kubernetes: every manifest parses and has apiVersion, kind,
            metadata.name and its namespace; selectors match pod labels;
            Services select a workload and target declared containerPorts;
            probes are grpc on declared ports; volumes, ConfigMaps, PVCs and
            --config paths resolve; KOLO_COORDINATOR names the Service; every
            kustomization lists existing files; `kubectl kustomize` renders
            the base and overlays (when kubectl exists) and the rendered
            objects pass the same checks.
  container deploy/container/Dockerfile: stages, entrypoints, ports, non-root
            user, the build packages cmake/KoloDependencies.cmake asks for;
            runtime-deps.sh run on a real binary.
  docs      docs/operations.md covers ports, socket, logs and hangs.

--self-test breaks copies of the files in known ways and asserts that each
breakage is reported, so the checks above cannot pass vacuously.

Only python3 + PyYAML (Debian python3-yaml) and the standard library.
Exit status 0 when everything checked passes; skipped parts are printed.
"""

import argparse
import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # pragma: no cover
    print("validate_deploy.py needs PyYAML: apt-get install python3-yaml", file=sys.stderr)
    sys.exit(2)

TOOL_TIMEOUT_S = 60

# The deployment's fixed facts, shared by all files.
AGENT_SOCKET = "/run/kolo/agent.sock"
PORT_COORDINATOR = 7470
PORT_AGENT_RPC = 7471
PORT_AGENT_METRICS = 7472
KOLO_UID = 10001

CLUSTER_SCOPED_KINDS = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "RuntimeClass", "PriorityClass", "StorageClass", "PersistentVolume", "Node",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
    "ResourceFlavor", "ClusterQueue",  # Kueue (overlays/gang-kueue)
}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet"}
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"

# Knobs each example must document (commented or not).
REQUIRED_KNOBS = {
    "agent": ["socket", "socket-mode", "socket-group", "coordinator", "rpc-listen",
              "rpc-auth-token-file", "timeline-dir", "metrics-listen", "arena-mb", "log-level"],
    "coordinator": ["listen", "state-dir", "lease-ms", "log-level"],
}


class Report:
    """Collects failures and skips of one run."""

    def __init__(self, verbose=True):
        self.failures = []
        self.skips = []
        self.checked = []
        self.verbose = verbose

    def section(self, name, errors):
        """Records the errors of one named check."""
        self.checked.append(name)
        for e in errors:
            self.failures.append(f"[{name}] {e}")
        if self.verbose:
            status = "ok" if not errors else f"FAILED ({len(errors)})"
            print(f"  {name}: {status}")
            for e in errors:
                print(f"      - {e}")

    def skip(self, name, why):
        self.skips.append(f"[{name}] {why}")
        if self.verbose:
            print(f"  {name}: SKIPPED: {why}")


def run_tool(argv, **kw):
    """Runs a command with a bounded wait; returns (rc, combined output)."""
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=kw.pop("timeout", TOOL_TIMEOUT_S), **kw)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        return 124, f"timed out after {e.timeout} s: {' '.join(argv)}"
    except OSError as e:
        return 127, f"cannot run {argv[0]}: {e}"


# --------------------------------------------------------------- config files

KNOB_RE = re.compile(r"^([a-z][a-z0-9-]*)\s*=\s*(.*)$")
COMMENTED_KNOB_RE = re.compile(r"^# ?([a-z][a-z0-9-]*) = ?(.*)$")


def parse_conf(text, where):
    """Parses a kolo `name = value` file the way common/config.cc does.

    Returns (active, commented, errors): dicts name -> value for live lines
    and for `# name = value` documentation lines.
    """
    active, commented, errors = {}, {}, []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = COMMENTED_KNOB_RE.match(line)
            if m:
                name, value = m.group(1), m.group(2).strip()
                if name in commented:
                    errors.append(f"{where}:{lineno}: knob '{name}' documented twice")
                commented[name] = value
            continue
        body = line.split("#", 1)[0].strip()
        m = KNOB_RE.match(body)
        if not m:
            errors.append(f"{where}:{lineno}: expected 'name = value', got '{raw}'")
            continue
        name, value = m.group(1), m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if name in active:
            errors.append(f"{where}:{lineno}: knob '{name}' set twice")
        active[name] = value
    both = set(active) & set(commented)
    for name in sorted(both):
        errors.append(f"{where}: knob '{name}' is both set and shown commented out")
    return active, commented, errors


def port_of(address):
    """'0.0.0.0:7471' / '[::]:7471' / 'host:7471' -> 7471, else None."""
    m = re.match(r"^(.*):(\d+)$", address or "")
    return int(m.group(2)) if m else None


def check_conf_examples(root):
    errors = []
    confs = {}
    for daemon in ("agent", "coordinator"):
        path = os.path.join(root, "deploy", "config", f"{daemon}.conf.example")
        if not os.path.isfile(path):
            errors.append(f"missing {os.path.relpath(path, root)}")
            continue
        with open(path) as f:
            active, commented, errs = parse_conf(f.read(), os.path.relpath(path, root))
        errors += errs
        known = {**commented, **active}
        for knob in REQUIRED_KNOBS[daemon]:
            if knob not in known:
                errors.append(f"{daemon}.conf.example does not document '{knob}'")
        confs[daemon] = known
    if "agent" in confs and "coordinator" in confs:
        a, c = confs["agent"], confs["coordinator"]
        expect = [
            (a.get("socket"), AGENT_SOCKET, "agent socket"),
            (port_of(a.get("rpc-listen")), PORT_AGENT_RPC, "agent rpc-listen port"),
            (port_of(a.get("metrics-listen")), PORT_AGENT_METRICS, "agent metrics-listen port"),
            (port_of(a.get("coordinator")), PORT_COORDINATOR, "agent coordinator port"),
            (port_of(c.get("listen")), PORT_COORDINATOR, "coordinator listen port"),
            (a.get("socket-mode"), "0660", "agent socket-mode"),
        ]
        for got, want, what in expect:
            if got != want:
                errors.append(f"{what}: example says {got!r}, deployment expects {want!r}")
    return errors


def parse_dump(text):
    """`name = value  # source` lines of --dump-config -> {name: value}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z][a-z0-9-]*)\s*=\s*(.*?)\s*(#.*)?$", line.strip())
        if m:
            value = m.group(2)
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            out[m.group(1)] = value
    return out


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOLO_", "HOROVOD_"))}
    return env


def check_conf_against_binary(binary, label, conf_text, where, compare_defaults):
    """Every knob in conf_text (commented ones uncommented) must be accepted
    by `binary --config F --dump-config`; with compare_defaults, commented
    values must equal the binary's non-empty defaults."""
    errors = []
    rc, out = run_tool([binary, "--dump-config"], env=clean_env(), timeout=20)
    if rc != 0:
        return [f"{label} --dump-config failed (rc {rc}): {out.strip()[-500:]}"]
    defaults = parse_dump(out)
    if not defaults:
        return [f"{label} --dump-config printed no 'name = value' lines"]
    active, commented, errs = parse_conf(conf_text, where)
    errors += errs
    for name in sorted({**active, **commented}):
        if name not in defaults:
            errors.append(f"{where}: '{name}' is not a knob of {label} "
                          f"(known: {', '.join(sorted(defaults))})")
    if compare_defaults:
        for name, value in sorted(commented.items()):
            d = defaults.get(name)
            if d not in (None, "") and value != d:
                errors.append(f"{where}: '# {name} = {value}' but {label}'s default is '{d}'")
    with tempfile.TemporaryDirectory(prefix="kolo-deploy-conf-") as tmp:
        path = os.path.join(tmp, "all-knobs.conf")
        with open(path, "w") as f:
            for name, value in {**commented, **active}.items():
                if name in defaults:
                    f.write(f"{name} = {value}\n")
        rc, out = run_tool([binary, "--config", path, "--dump-config"], env=clean_env(),
                           timeout=20)
        if rc != 0:
            errors.append(f"{where}: {label} rejects the documented values: {out.strip()[-500:]}")
    return errors


# ------------------------------------------------------------------- systemd

def parse_unit(text):
    """Returns {section: {key: [values...]}} (systemd allows repeated keys)."""
    sections, cur = {}, None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i].strip()
        i += 1
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            cur = sections.setdefault(line[1:-1], {})
            continue
        if "=" in line and cur is not None:
            k, v = line.split("=", 1)
            cur.setdefault(k.strip(), []).append(v.strip())
    return sections


def unit_get(unit, section, key):
    vals = unit.get(section, {}).get(key, [])
    return vals[-1] if vals else None


UNIT_REQUIREMENTS = {
    "kolo-agent.service": {
        ("Service", "Type"): "notify",
        ("Service", "RuntimeDirectory"): "kolo",
        ("Service", "RuntimeDirectoryMode"): "0755",
        ("Service", "Group"): "kolo",
        ("Service", "LimitMEMLOCK"): "infinity",
    },
    "kolo-coordinator.service": {
        ("Service", "Type"): "notify",
        ("Service", "StateDirectory"): "kolo-coordinator",
    },
}
COMMON_HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "ProtectKernelTunables": "yes",
}
REQUIRED_PRESENT = ["RestartSec", "LimitNOFILE", "PrivateTmp"]
RESTART_POLICIES = {"always", "on-failure"}
# systemd's defaults (DefaultStartLimitIntervalSec=, DefaultStartLimitBurst=).
DEFAULT_START_LIMIT_INTERVAL_S = 10.0
DEFAULT_START_LIMIT_BURST = 5


def systemd_seconds(value):
    """'2s' / '2' / '500ms' / '1min 30s' / 'infinity' -> seconds (float), None if unparsable."""
    if value is None:
        return None
    v = value.strip()
    if v == "infinity":
        return float("inf")
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60,
             "min": 60, "minute": 60, "minutes": 60, "h": 3600, "hr": 3600, "hour": 3600,
             "hours": 3600, "d": 86400, "day": 86400, "days": 86400}
    total, pos = 0.0, 0
    for m in re.finditer(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)", v):
        if m.start() != pos:
            return None
        unit = m.group(2) or "s"
        if unit not in units:
            return None
        total += float(m.group(1)) * units[unit]
        pos = m.end()
    return total if pos == len(v) and pos > 0 else None


def check_restart_policy(name, unit):
    """A burst of crashes must not leave the node without the daemon: the
    unit restarts (Restart=always or on-failure, RestartSec > 0) and its
    start limit can never trip at that pace (StartLimitIntervalSec=0, or a
    StartLimitBurst above the starts RestartSec allows in the interval)."""
    errors = []
    restart = unit_get(unit, "Service", "Restart")
    if restart not in RESTART_POLICIES:
        errors.append(f"{name}: [Service] Restart={restart} (want one of "
                      f"{', '.join(sorted(RESTART_POLICIES))})")
    delay = systemd_seconds(unit_get(unit, "Service", "RestartSec"))
    if delay is None or delay <= 0:
        errors.append(f"{name}: [Service] RestartSec={unit_get(unit, 'Service', 'RestartSec')} "
                      "(want a positive delay, so that restarts are paced)")
    for key in ("StartLimitIntervalSec", "StartLimitBurst"):
        if unit_get(unit, "Service", key) is not None:
            errors.append(f"{name}: {key}= belongs in [Unit], not [Service]")
    interval_text = unit_get(unit, "Unit", "StartLimitIntervalSec")
    burst_text = unit_get(unit, "Unit", "StartLimitBurst")
    interval = DEFAULT_START_LIMIT_INTERVAL_S if interval_text is None else systemd_seconds(interval_text)
    if interval is None:
        errors.append(f"{name}: [Unit] StartLimitIntervalSec={interval_text} is not a time span")
        return errors
    try:
        burst = DEFAULT_START_LIMIT_BURST if burst_text is None else int(burst_text)
    except ValueError:
        errors.append(f"{name}: [Unit] StartLimitBurst={burst_text} is not a number")
        return errors
    if interval == 0 or delay is None or delay <= 0:
        return errors
    # Restarts RestartSec apart: at most interval/RestartSec + 1 starts in any
    # window of StartLimitIntervalSec; more than the burst stops the unit.
    most = int(interval // delay) + 1 if interval != float("inf") else float("inf")
    if most > burst:
        errors.append(f"{name}: StartLimitIntervalSec={interval_text or 'default 10s'} "
                      f"StartLimitBurst={burst_text or 'default 5'} with RestartSec="
                      f"{unit_get(unit, 'Service', 'RestartSec')}: up to {most} starts fit in the "
                      "interval, more than the burst, so a crash loop stops the restarts for "
                      "good (set StartLimitIntervalSec=0, or a burst above the starts "
                      "RestartSec allows in the interval)")
    return errors
ADDRESS_FAMILIES = {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}


def check_unit_static(name, text):
    errors = []
    unit = parse_unit(text)
    daemon = name.replace(".service", "")
    exec_start = unit_get(unit, "Service", "ExecStart") or ""
    argv = shlex.split(exec_start)
    if not argv or argv[0] != f"/usr/bin/{daemon}":
        errors.append(f"{name}: ExecStart must run /usr/bin/{daemon}, got '{exec_start}'")
    conf = f"/etc/kolo/{daemon.replace('kolo-', '')}.conf"
    if "--config" not in argv or argv[argv.index("--config") + 1:][:1] != [conf]:
        errors.append(f"{name}: ExecStart must pass --config {conf}")
    reqs = dict(UNIT_REQUIREMENTS.get(name, {}))
    for k, v in COMMON_HARDENING.items():
        reqs[("Service", k)] = v
    for (sec, key), want in sorted(reqs.items()):
        got = unit_get(unit, sec, key)
        if got != want:
            errors.append(f"{name}: [{sec}] {key}={got} (want {want})")
    for key in REQUIRED_PRESENT:
        if unit_get(unit, "Service", key) is None:
            errors.append(f"{name}: [Service] {key}= must be set (and its choice documented)")
    errors += check_restart_policy(name, unit)
    fams = set(" ".join(unit.get("Service", {}).get("RestrictAddressFamilies", [])).split())
    if fams != ADDRESS_FAMILIES:
        errors.append(f"{name}: RestrictAddressFamilies={' '.join(sorted(fams))} "
                      f"(want {' '.join(sorted(ADDRESS_FAMILIES))})")
    if not unit.get("Install", {}).get("WantedBy"):
        errors.append(f"{name}: [Install] WantedBy= missing")
    if name == "kolo-agent.service":
        rd = unit_get(unit, "Service", "RuntimeDirectory")
        if rd and os.path.dirname(AGENT_SOCKET) != f"/run/{rd}":
            errors.append(f"{name}: socket {AGENT_SOCKET} is not in /run/{rd}")
    if name == "kolo-coordinator.service":
        sd = unit_get(unit, "Service", "StateDirectory")
        if "--state-dir" in argv:
            got = argv[argv.index("--state-dir") + 1] if argv[-1] != "--state-dir" else ""
            if got not in (f"%S/{sd}", f"/var/lib/{sd}"):
                errors.append(f"{name}: --state-dir {got} is not the StateDirectory ({sd})")
    return errors


def verify_units(units, workdir):
    """systemd-analyze verify on copies of `units` ({name: text}) whose
    ExecStart binaries are stubs. Returns errors (None if the tool is absent)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return None
    errors = []
    bindir = os.path.join(workdir, "bin")
    os.makedirs(bindir, exist_ok=True)
    paths = []
    for name, text in units.items():
        def stub(m):
            exe = os.path.join(bindir, os.path.basename(m.group(2)))
            with open(exe, "w") as f:
                f.write("#!/bin/sh\nexit 0\n")
            os.chmod(exe, 0o755)
            return m.group(1) + exe
        rewritten = re.sub(r"^(Exec\w+=[-@:+!]*)(\S+)", stub, text, flags=re.M)
        path = os.path.join(workdir, name)
        with open(path, "w") as f:
            f.write(rewritten)
        paths.append(path)
    env = dict(os.environ, SYSTEMD_COLORS="0", SYSTEMD_PAGER="", LC_ALL="C")
    rc, out = run_tool([tool, "verify", "--man=no"] + paths, cwd=workdir, env=env)
    ours = [l for l in out.splitlines()
            if any(n in l for n in units) or workdir in l]
    if rc != 0 or ours:
        errors.append(f"systemd-analyze verify (rc {rc}): " + ("; ".join(ours) or out.strip()))
    return errors


SECURITY_CEILING = {"kolo-agent.service": 5.0, "kolo-coordinator.service": 2.5}


def security_units(units, workdir):
    """`systemd-analyze security --offline` exposure must stay under a ceiling."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return None
    errors = []
    env = dict(os.environ, SYSTEMD_COLORS="0", SYSTEMD_PAGER="", LC_ALL="C")
    for name in units:
        path = os.path.join(workdir, name)  # written by verify_units
        ceiling = SECURITY_CEILING.get(name, 5.0)
        rc, out = run_tool([tool, "security", "--offline=true", "--no-pager", path],
                           cwd=workdir, env=env)
        if "offline" in out and "nrecognized" in out:
            return None  # systemd older than 250
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)
        if not m:
            errors.append(f"{name}: no exposure level from systemd-analyze security: "
                          f"{out.strip()[-300:]}")
            continue
        level = float(m.group(1))
        if level > ceiling:
            errors.append(f"{name}: exposure {level} > {ceiling}")
    return errors


def check_sysusers(root, units):
    """The sysusers snippet creates the users/groups the units name."""
    path = os.path.join(root, "deploy", "systemd", "kolo.sysusers")
    if not os.path.isfile(path):
        return ["missing deploy/systemd/kolo.sysusers"], False
    tool = shutil.which("systemd-sysusers")
    needed_users, needed_groups = set(), set()
    for text in units.values():
        u = parse_unit(text)
        if (unit_get(u, "Service", "DynamicUser") or "no") in ("yes", "true", "1"):
            continue
        if unit_get(u, "Service", "User"):
            needed_users.add(unit_get(u, "Service", "User"))
        if unit_get(u, "Service", "Group"):
            needed_groups.add(unit_get(u, "Service", "Group"))
    if tool is None:
        return [], False
    with tempfile.TemporaryDirectory(prefix="kolo-sysusers-") as tmp:
        os.makedirs(os.path.join(tmp, "etc"))
        rc, out = run_tool([tool, f"--root={tmp}", os.path.abspath(path)])
        if rc != 0:
            return [f"systemd-sysusers rejects kolo.sysusers: {out.strip()}"], True

        def names(fname):
            try:
                with open(os.path.join(tmp, "etc", fname)) as f:
                    return {l.split(":")[0] for l in f if l.strip()}
            except OSError:
                return set()
        errors = []
        for u in sorted(needed_users - names("passwd")):
            errors.append(f"kolo.sysusers does not create user '{u}'")
        for g in sorted(needed_groups - names("group")):
            errors.append(f"kolo.sysusers does not create group '{g}'")
        return errors, True


MPS_UNIT = "kolo-mps.service"
MPS_PIPE_DIR = "/run/kolo-mps"


def unit_env(unit):
    """[Service] Environment= assignments as a dict."""
    env = {}
    for line in unit.get("Service", {}).get("Environment", []):
        for item in shlex.split(line):
            if "=" in item:
                k, v = item.split("=", 1)
                env[k] = v
    return env


def check_mps_unit(text, agent_text):
    """kolo-mps.service: the node's CUDA MPS control daemon in the
    foreground, its pipe directory a RuntimeDirectory the agent also points
    CUDA at, before the agent, as the agent's user (MPS serves one uid),
    skipped without a GPU, restarted like the daemons."""
    errors = []
    unit = parse_unit(text)
    agent = parse_unit(agent_text or "")
    name = MPS_UNIT
    argv = shlex.split(unit_get(unit, "Service", "ExecStart") or "")
    if argv[:1] != ["/usr/bin/nvidia-cuda-mps-control"] or "-f" not in argv:
        errors.append(f"{name}: ExecStart must run /usr/bin/nvidia-cuda-mps-control -f "
                      f"(foreground), got {' '.join(argv)}")
    if unit_get(unit, "Service", "Type") not in (None, "simple", "exec"):
        errors.append(f"{name}: Type={unit_get(unit, 'Service', 'Type')} with a foreground "
                      "daemon (want simple or exec)")
    if "quit" not in (unit_get(unit, "Service", "ExecStop") or ""):
        errors.append(f"{name}: ExecStop must send `quit` to nvidia-cuda-mps-control")
    pipe = unit_env(unit).get(MPS_PIPE_ENV)
    if pipe != MPS_PIPE_DIR:
        errors.append(f"{name}: {MPS_PIPE_ENV}={pipe} (want {MPS_PIPE_DIR})")
    rd = unit_get(unit, "Service", "RuntimeDirectory")
    if pipe and f"/run/{rd}" != pipe:
        errors.append(f"{name}: the pipe directory {pipe} is not its RuntimeDirectory (/run/{rd})")
    if unit_get(unit, "Service", "RuntimeDirectoryMode") not in ("0755", "0750"):
        errors.append(f"{name}: RuntimeDirectoryMode must let the trainers reach the pipes")
    if not unit_env(unit).get("CUDA_MPS_LOG_DIRECTORY"):
        errors.append(f"{name}: CUDA_MPS_LOG_DIRECTORY is not set")
    if "kolo-agent.service" not in " ".join(unit.get("Unit", {}).get("Before", [])):
        errors.append(f"{name}: must start Before=kolo-agent.service")
    if "/dev/nvidiactl" not in " ".join(unit.get("Unit", {}).get("ConditionPathExists", [])):
        errors.append(f"{name}: ConditionPathExists=/dev/nvidiactl missing (GPU nodes only)")
    agent_pipe = unit_env(agent).get(MPS_PIPE_ENV)
    if agent_pipe != pipe:
        errors.append(f"kolo-agent.service: {MPS_PIPE_ENV}={agent_pipe}, but kolo-mps.service's "
                      f"pipe directory is {pipe}: the agent would run without MPS")
    if not any(MPS_UNIT in v for v in agent.get("Unit", {}).get("After", [])):
        errors.append(f"kolo-agent.service: After={MPS_UNIT} missing")
    for key in ("User", "Group"):
        if unit_get(unit, "Service", key) != unit_get(agent, "Service", key):
            errors.append(f"{name}: {key}={unit_get(unit, 'Service', key)} differs from the "
                          f"agent's ({unit_get(agent, 'Service', key)}): MPS serves one uid")
    for k, v in COMMON_HARDENING.items():
        if unit_get(unit, "Service", k) != v:
            errors.append(f"{name}: [Service] {k}={unit_get(unit, 'Service', k)} (want {v})")
    errors += check_restart_policy(name, unit)
    if not unit.get("Install", {}).get("WantedBy"):
        errors.append(f"{name}: [Install] WantedBy= missing")
    return errors


def load_units(root):
    d = os.path.join(root, "deploy", "systemd")
    units = {}
    for name in ("kolo-agent.service", "kolo-coordinator.service", MPS_UNIT):
        p = os.path.join(d, name)
        if os.path.isfile(p):
            with open(p) as f:
                units[name] = f.read()
    return units


# ---------------------------------------------------------------- kubernetes

def labels_of(obj):
    return (obj.get("metadata") or {}).get("labels") or {}


def pod_template(obj):
    return ((obj.get("spec") or {}).get("template") or {})


def pod_spec(obj):
    return pod_template(obj).get("spec") or {}


def containers_of(obj, init=False):
    spec = pod_spec(obj)
    out = list(spec.get("containers") or [])
    if init:
        out += list(spec.get("initContainers") or [])
    return out


def selector_matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def object_id(obj):
    md = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{md.get('name')}"


def check_required_fields(obj, where, namespace):
    errors = []
    for field in ("apiVersion", "kind"):
        if not obj.get(field):
            errors.append(f"{where}: missing {field}")
    md = obj.get("metadata") or {}
    if not md.get("name"):
        errors.append(f"{where}: missing metadata.name")
    kind = obj.get("kind")
    if kind and kind not in CLUSTER_SCOPED_KINDS:
        ns = md.get("namespace")
        if not ns:
            errors.append(f"{where}: {object_id(obj)} has no metadata.namespace")
        elif namespace and ns != namespace:
            errors.append(f"{where}: {object_id(obj)} is in namespace {ns}, "
                          f"kustomization says {namespace}")
    return errors


LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


def check_agent_admin_access(where, cname, active, container, volumes):
    """An agent's config in a workload: the kubelet's gRPC probes come to the
    pod's address, so rpc-listen (loopback by default) must be set to a
    non-loopback address; and then Drain and Timeline must need the admin
    token, read from a mounted Secret."""
    if "socket" not in active and "rpc-listen" not in active:
        return []  # not an agent's config
    errors = []
    listen = active.get("rpc-listen", "127.0.0.1:7471 (default)")
    host = listen.split(" ")[0].rpartition(":")[0]
    probed = any(isinstance((container.get(k) or {}).get("grpc"), dict)
                 for k in ("startupProbe", "readinessProbe", "livenessProbe"))
    if host in LOOPBACK_HOSTS:
        if probed:
            errors.append(f"{where}: {cname}: rpc-listen = {listen} is loopback, but the kubelet's "
                          "gRPC probes come to the pod's address")
        return errors
    token = active.get("rpc-auth-token-file")
    if not token:
        errors.append(f"{where}: {cname}: rpc-listen = {listen} serves the pod network without "
                      "rpc-auth-token-file (Drain and Timeline need an admin token there)")
        return errors
    mounts = {m.get("mountPath"): m.get("name") for m in container.get("volumeMounts") or []}
    vol = volumes.get(mounts.get(os.path.dirname(token))) or {}
    if "secret" not in vol:
        errors.append(f"{where}: {cname}: rpc-auth-token-file {token} is not in a mounted Secret")
    return errors


TLS_ENV = ("KOLO_TLS_CERT", "KOLO_RPC_TLS_CERT")
TLS_KEYS = ("tls-cert", "rpc-tls-cert")


def container_conf(c, volumes, configmaps, ns):
    """The active keys of the daemon config file (--config) a container
    reads from a ConfigMap, or {}."""
    args = list(c.get("args") or [])
    if "--config" not in args[:-1]:
        return {}
    cfg = args[args.index("--config") + 1]
    vname = {m.get("mountPath"): m.get("name")
             for m in c.get("volumeMounts") or []}.get(os.path.dirname(cfg))
    cm_ref = ((volumes.get(vname) or {}).get("configMap") or {}).get("name")
    text = ((configmaps.get((ns, cm_ref)) or {}).get("data") or {}).get(os.path.basename(cfg))
    if text is None:
        return {}
    active, _, _ = parse_conf(text, cm_ref)
    return active


def tls_enabled(c, active):
    """What turns TLS on for the daemon's gRPC port, or None."""
    env = {e.get("name"): e.get("value") for e in c.get("env") or []}
    for k in TLS_ENV:
        if env.get(k):
            return f"env {k}"
    for k in TLS_KEYS:
        if active.get(k):
            return f"config {k}"
    return None


def coordinator_on_etcd(w):
    """A coordinator workload whose state is in etcd (several replicas elect
    a leader): KOLO_ETCD_ENDPOINTS or --etcd-endpoints, and no --state-dir."""
    for c in containers_of(w):
        args = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        env = {e.get("name") for e in c.get("env") or []}
        etcd = "KOLO_ETCD_ENDPOINTS" in env or any(a.startswith("--etcd-endpoints") for a in args)
        state_dir = "KOLO_STATE_DIR" in env or any(a.startswith("--state-dir") for a in args)
        if etcd and not state_dir:
            return True
    return False


def check_objects(objs, where):
    """Semantic checks over one set of objects (a base or a rendered overlay)."""
    errors = []
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o.get("kind"), []).append(o)
    workloads = [o for o in objs if o.get("kind") in WORKLOAD_KINDS]
    configmaps = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o
                  for o in by_kind.get("ConfigMap", [])}
    pvcs = {(o["metadata"].get("namespace"), o["metadata"]["name"])
            for o in by_kind.get("PersistentVolumeClaim", [])}
    services = by_kind.get("Service", [])
    namespaces = {o["metadata"]["name"] for o in by_kind.get("Namespace", [])}

    for o in objs:
        oid = object_id(o)
        ns = (o.get("metadata") or {}).get("namespace")
        if ns and namespaces and ns not in namespaces:
            errors.append(f"{where}: {oid} uses namespace {ns}, which no Namespace creates")
        if o.get("kind") != "Namespace" and labels_of(o).get(LABEL_NAME) != "kolo":
            errors.append(f"{where}: {oid} lacks label {LABEL_NAME}: kolo")
        if o.get("kind") in WORKLOAD_KINDS | {"Service", "ConfigMap", "PersistentVolumeClaim"}:
            if not labels_of(o).get(LABEL_COMPONENT):
                errors.append(f"{where}: {oid} lacks label {LABEL_COMPONENT}")

    for w in workloads:
        wid = object_id(w)
        ns = w["metadata"].get("namespace")
        sel = ((w.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        tlabels = (pod_template(w).get("metadata") or {}).get("labels") or {}
        if not sel:
            errors.append(f"{where}: {wid} has no spec.selector.matchLabels")
        elif not selector_matches(sel, tlabels):
            errors.append(f"{where}: {wid} selector {sel} does not match its pod labels {tlabels}")
        if labels_of(w).get(LABEL_COMPONENT) != tlabels.get(LABEL_COMPONENT):
            errors.append(f"{where}: {wid} component label differs from its pod template's")
        if w.get("kind") == "Deployment" and (w["spec"].get("replicas", 1) != 1 or
                                              (w["spec"].get("strategy") or {}).get("type")
                                              != "Recreate"):
            if tlabels.get(LABEL_COMPONENT) == "coordinator" and not coordinator_on_etcd(w):
                errors.append(f"{where}: {wid}: the coordinator needs replicas: 1 and "
                              "strategy Recreate (one journal writer), unless its state is in "
                              "etcd (--etcd-endpoints, no --state-dir)")
        spec = pod_spec(w)
        volumes = {v.get("name"): v for v in spec.get("volumes") or []}
        for c in containers_of(w, init=True):
            cname = f"{wid}[{c.get('name')}]"
            if not c.get("image"):
                errors.append(f"{where}: {cname} has no image")
            mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
            for path, vname in mounts.items():
                if vname not in volumes:
                    errors.append(f"{where}: {cname} mounts undeclared volume '{vname}'")
            # --config FILE must come from a mounted ConfigMap key.
            args = list(c.get("command") or []) + list(c.get("args") or [])
            if "--config" in args:
                cfg = args[args.index("--config") + 1] if args[-1] != "--config" else ""
                vname = mounts.get(os.path.dirname(cfg))
                cm_ref = ((volumes.get(vname) or {}).get("configMap") or {}).get("name")
                cm = configmaps.get((ns, cm_ref))
                if cm is None:
                    errors.append(f"{where}: {cname}: --config {cfg} is not in a mounted "
                                  "ConfigMap")
                elif os.path.basename(cfg) not in (cm.get("data") or {}):
                    errors.append(f"{where}: {cname}: ConfigMap {cm_ref} has no key "
                                  f"{os.path.basename(cfg)}")
        for vname, v in volumes.items():
            if "configMap" in v and (ns, v["configMap"].get("name")) not in configmaps:
                errors.append(f"{where}: {wid} volume {vname}: no ConfigMap "
                              f"{v['configMap'].get('name')}")
            if "persistentVolumeClaim" in v and \
                    (ns, v["persistentVolumeClaim"].get("claimName")) not in pvcs:
                errors.append(f"{where}: {wid} volume {vname}: no PersistentVolumeClaim "
                              f"{v['persistentVolumeClaim'].get('claimName')}")
        for c in containers_of(w):
            cname = f"{wid}[{c.get('name')}]"
            port_numbers = {p.get("containerPort") for p in c.get("ports") or []}
            for kind in ("readinessProbe", "livenessProbe"):
                if kind not in c:
                    errors.append(f"{where}: {cname} has no {kind}")
            tls = tls_enabled(c, container_conf(c, volumes, configmaps, ns))
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(kind)
                if probe is None:
                    continue
                grpc = probe.get("grpc")
                if tls:
                    # The kubelet's gRPC probes are plain text: with TLS on,
                    # /healthz on the plain-HTTP metrics port.
                    http = probe.get("httpGet") or {}
                    if isinstance(grpc, dict):
                        errors.append(f"{where}: {cname} {kind} is a grpc probe, but the daemon "
                                      f"serves TLS ({tls}): the kubelet's gRPC probes do not "
                                      "speak TLS; probe httpGet /healthz on the metrics port")
                    elif http.get("path") != "/healthz" or http.get("port") not in port_numbers:
                        errors.append(f"{where}: {cname} {kind}: with TLS on, want httpGet "
                                      f"/healthz on a declared port, got {probe}")
                    continue
                if not isinstance(grpc, dict):
                    errors.append(f"{where}: {cname} {kind} is not a grpc probe "
                                  "(grpc.health.v1 is the daemons' health check)")
                    continue
                if grpc.get("port") not in port_numbers:
                    errors.append(f"{where}: {cname} {kind} grpc port {grpc.get('port')} "
                                  f"is not a declared containerPort {sorted(port_numbers)}")
            # Daemon config vs. ports: listen addresses must be declared ports
            # and the probes must hit the gRPC one.
            args = list(c.get("args") or [])
            if "--config" in args:
                cfg = args[args.index("--config") + 1]
                vname = {m.get("mountPath"): m.get("name")
                         for m in c.get("volumeMounts") or []}.get(os.path.dirname(cfg))
                cm_ref = ((volumes.get(vname) or {}).get("configMap") or {}).get("name")
                cm = configmaps.get((ns, cm_ref))
                text = ((cm or {}).get("data") or {}).get(os.path.basename(cfg))
                if text is not None:
                    active, _, perrs = parse_conf(text, f"ConfigMap {cm_ref}")
                    errors += [f"{where}: {e}" for e in perrs]
                    grpc_key = "rpc-listen" if "rpc-listen" in active else "listen"
                    for key in ("rpc-listen", "listen", "metrics-listen"):
                        if key in active and port_of(active[key]) not in port_numbers:
                            errors.append(f"{where}: {cname}: {key} = {active[key]} but the "
                                          f"container declares ports {sorted(port_numbers)}")
                    gport = port_of(active.get(grpc_key))
                    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                        p = ((c.get(kind) or {}).get("grpc") or {}).get("port")
                        if gport is not None and p is not None and p != gport:
                            errors.append(f"{where}: {cname} {kind} probes port {p}, but "
                                          f"{grpc_key} is {active[grpc_key]}")
                    ann = (pod_template(w).get("metadata") or {}).get("annotations") or {}
                    if "metrics-listen" in active and "prometheus.io/port" in ann and \
                            str(port_of(active["metrics-listen"])) != ann["prometheus.io/port"]:
                        errors.append(f"{where}: {wid} prometheus.io/port "
                                      f"{ann['prometheus.io/port']} != metrics-listen port")
                    errors += check_agent_admin_access(where, cname, active, c, volumes)
                    sock = active.get("socket")
                    if sock:
                        sock_dir = os.path.dirname(sock)
                        vname = {m.get("mountPath"): m.get("name")
                                 for m in c.get("volumeMounts") or []}.get(sock_dir)
                        hp = (volumes.get(vname) or {}).get("hostPath") or {}
                        if hp.get("path") != sock_dir:
                            errors.append(f"{where}: {cname}: socket dir {sock_dir} is not a "
                                          "hostPath mount of the same node path")
            # KOLO_COORDINATOR must name a Service and one of its ports.
            for e in c.get("env") or []:
                if e.get("name") != "KOLO_COORDINATOR":
                    continue
                value = e.get("value") or ""
                host, _, port = value.rpartition(":")
                parts = host.split(".")
                svc_name = parts[0]
                svc_ns = parts[1] if len(parts) > 1 else ns
                svc = [s for s in services if s["metadata"]["name"] == svc_name and
                       s["metadata"].get("namespace") == svc_ns]
                if not svc:
                    errors.append(f"{where}: {cname}: KOLO_COORDINATOR={value} names no "
                                  "Service")
                elif not port.isdigit() or int(port) not in \
                        {p.get("port") for p in svc[0]["spec"].get("ports") or []}:
                    errors.append(f"{where}: {cname}: KOLO_COORDINATOR={value}: port is not "
                                  f"a port of Service {svc_name}")

    for s in services:
        sid = object_id(s)
        ns = s["metadata"].get("namespace")
        sel = (s.get("spec") or {}).get("selector") or {}
        matched = [w for w in workloads if w["metadata"].get("namespace") == ns and
                   selector_matches(sel, (pod_template(w).get("metadata") or {})
                                    .get("labels") or {})]
        if not matched:
            errors.append(f"{where}: {sid} selector {sel} matches no workload's pod labels")
            continue
        for p in (s.get("spec") or {}).get("ports") or []:
            target = p.get("targetPort", p.get("port"))
            ok = False
            for w in matched:
                for c in containers_of(w):
                    for cp in c.get("ports") or []:
                        if target == cp.get("containerPort") or target == cp.get("name"):
                            ok = True
            if not ok:
                errors.append(f"{where}: {sid} port {p.get('name') or p.get('port')}: "
                              f"targetPort {target} is not a containerPort of "
                              f"{', '.join(object_id(w) for w in matched)}")
    return errors


def load_yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def check_kustomizations(root):
    """Every kustomization lists existing files and every manifest next to it
    is listed. Returns (errors, [(dir, kustomization)])."""
    errors, found = [], []
    kdir = os.path.join(root, "deploy", "kubernetes")
    for dirpath, _, files in os.walk(kdir):
        if "kustomization.yaml" not in files:
            yamls = [f for f in files if f.endswith((".yaml", ".yml"))]
            if yamls:
                errors.append(f"{os.path.relpath(dirpath, root)}: manifests without a "
                              "kustomization.yaml")
            continue
        kpath = os.path.join(dirpath, "kustomization.yaml")
        try:
            docs = load_yaml_docs(kpath)
        except yaml.YAMLError as e:
            errors.append(f"{os.path.relpath(kpath, root)}: {e}")
            continue
        if len(docs) != 1 or not isinstance(docs[0], dict):
            errors.append(f"{os.path.relpath(kpath, root)}: not one mapping")
            continue
        k = docs[0]
        rel = os.path.relpath(kpath, root)
        if k.get("kind") != "Kustomization":
            errors.append(f"{rel}: kind is {k.get('kind')}, want Kustomization")
        listed = set()
        refs = list(k.get("resources") or [])
        for p in k.get("patches") or []:
            if isinstance(p, dict) and p.get("path"):
                refs.append(p["path"])
        refs += list(k.get("patchesStrategicMerge") or [])
        refs += list(k.get("components") or [])
        for ref in refs:
            target = os.path.normpath(os.path.join(dirpath, ref))
            listed.add(target)
            if os.path.isdir(target):
                if not os.path.isfile(os.path.join(target, "kustomization.yaml")):
                    errors.append(f"{rel}: {ref} is a directory without kustomization.yaml")
            elif not os.path.isfile(target):
                errors.append(f"{rel}: lists {ref}, which does not exist")
        for f in files:
            full = os.path.join(dirpath, f)
            if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml" and \
                    full not in listed:
                errors.append(f"{rel}: {f} is in the directory but not listed")
        found.append((dirpath, k))
    if not found:
        errors.append("no kustomization.yaml under deploy/kubernetes")
    return errors, found


def base_objects(root, kustomizations):
    """Objects of the resources files of the kustomizations that list plain
    files (the bases), with where each came from; plus the base namespace."""
    errors, objs = [], []
    for dirpath, k in kustomizations:
        namespace = k.get("namespace")
        for ref in k.get("resources") or []:
            path = os.path.normpath(os.path.join(dirpath, ref))
            if not os.path.isfile(path):
                continue
            rel = os.path.relpath(path, root)
            try:
                docs = load_yaml_docs(path)
            except yaml.YAMLError as e:
                errors.append(f"{rel}: {e}")
                continue
            for i, d in enumerate(docs):
                where = f"{rel}#{i}"
                if not isinstance(d, dict):
                    errors.append(f"{where}: not a mapping")
                    continue
                errors += check_required_fields(d, where, namespace)
                objs.append(d)
        # Patches: parse, identify a target in the rendered set later.
        for p in k.get("patches") or []:
            if isinstance(p, dict) and p.get("path"):
                path = os.path.normpath(os.path.join(dirpath, p["path"]))
                if os.path.isfile(path):
                    try:
                        for d in load_yaml_docs(path):
                            for field in ("apiVersion", "kind"):
                                if not d.get(field):
                                    errors.append(f"{os.path.relpath(path, root)}: patch "
                                                  f"missing {field}")
                            if not (d.get("metadata") or {}).get("name"):
                                errors.append(f"{os.path.relpath(path, root)}: patch missing "
                                              "metadata.name")
                    except yaml.YAMLError as e:
                        errors.append(f"{os.path.relpath(path, root)}: {e}")
    return errors, objs


def check_images_listed(objs, kustomizations):
    errors = []
    names = set()
    for _, k in kustomizations:
        for im in k.get("images") or []:
            names.add(im.get("name"))
    for w in objs:
        if w.get("kind") not in WORKLOAD_KINDS:
            continue
        for c in containers_of(w, init=True):
            image = (c.get("image") or "").split("@")[0]
            base = image.rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image
            if base not in names:
                errors.append(f"{object_id(w)}[{c.get('name')}]: image {base} is not in any "
                              "kustomization's images: list")
    return errors


def check_k8s_uid(objs):
    """The Dockerfile's kolo uid is the one the pods run as / chown to."""
    errors = []
    for w in objs:
        if w.get("kind") not in WORKLOAD_KINDS:
            continue
        psc = pod_spec(w).get("securityContext") or {}
        for c in containers_of(w):
            uid = (c.get("securityContext") or {}).get("runAsUser", psc.get("runAsUser"))
            if uid != KOLO_UID:
                errors.append(f"{object_id(w)}[{c.get('name')}] runs as uid {uid}, "
                              f"want {KOLO_UID} (the image's kolo user)")
        for c in pod_spec(w).get("initContainers") or []:
            cmd = " ".join(c.get("command") or [])
            if "chown" in cmd and f"{KOLO_UID}:{KOLO_UID}" not in cmd:
                errors.append(f"{object_id(w)}[{c.get('name')}] chowns to another uid")
    return errors


def render_kustomization(dirpath):
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        rc, out = run_tool([kubectl, "kustomize", dirpath])
    elif shutil.which("kustomize"):
        rc, out = run_tool([shutil.which("kustomize"), "build", dirpath])
    else:
        return None, "neither kubectl nor kustomize is installed"
    if rc != 0:
        return None, out.strip()
    try:
        return [d for d in yaml.safe_load_all(out) if d is not None], None
    except yaml.YAMLError as e:
        return None, f"rendered output does not parse: {e}"


# ------------------------------------------------------------------ TLS files

TLS_FILE_ENV = re.compile(r"^KOLO_[A-Z_]*(_CA|_CERT|_KEY)$")


def check_tls_files(objs):
    """Every KOLO_..._CA/_CERT/_KEY a container sets is a file of a Secret
    the container mounts (a path elsewhere does not exist in the pod)."""
    errors = []
    for w in objs:
        if w.get("kind") not in WORKLOAD_KINDS:
            continue
        vols = {v.get("name"): v for v in pod_spec(w).get("volumes") or []}
        for c in containers_of(w, init=True):
            secret_dirs = [m.get("mountPath") for m in c.get("volumeMounts") or []
                           if "secret" in (vols.get(m.get("name")) or {})]
            for e in c.get("env") or []:
                if not TLS_FILE_ENV.match(e.get("name") or "") or "value" not in e:
                    continue
                path = str(e["value"])
                if os.path.dirname(path) not in secret_dirs:
                    errors.append(f"{object_id(w)}[{c.get('name')}]: {e['name']}={path} is not "
                                  f"in a mounted Secret (mounted: {secret_dirs})")
    return errors


def check_mtls_overlay(objs):
    """Mutual TLS: the coordinator and the agents' status service require a
    client certificate, and every client in the pods presents one: the
    agents to the coordinator, the `kolo` CLI in each container to the
    daemons it reaches."""
    errors = check_tls_files(objs)
    found = set()
    for w in objs:
        if w.get("kind") not in WORKLOAD_KINDS:
            continue
        component = labels_of(w).get(LABEL_COMPONENT)
        for c in containers_of(w):
            env = {e.get("name"): e.get("value") for e in c.get("env") or []}
            cname = f"{object_id(w)}[{c.get('name')}]"
            if component == "coordinator":
                found.add("coordinator")
                want = {"KOLO_TLS_CERT": "serves TLS", "KOLO_TLS_CLIENT_CA":
                        "requires client certificates (--tls-client-ca)",
                        "KOLO_COORDINATOR_CERT": "the kolo CLI's client certificate",
                        "KOLO_COORDINATOR_KEY": "the kolo CLI's client key",
                        "KOLO_COORDINATOR_CA": "the kolo CLI's CA"}
            elif component == "agent":
                found.add("agent")
                want = {"KOLO_RPC_TLS_CERT": "serves TLS on its status service",
                        "KOLO_RPC_TLS_CLIENT_CA": "requires client certificates on its status "
                                                  "service (--rpc-tls-client-ca)",
                        "KOLO_COORDINATOR_CERT": "presents a client certificate to the "
                                                 "coordinator (--coordinator-cert)",
                        "KOLO_COORDINATOR_KEY": "its key (--coordinator-key)",
                        "KOLO_COORDINATOR_CA": "verifies the coordinator",
                        "KOLO_AGENT_CERT": "the kolo CLI's client certificate (preStop drain)",
                        "KOLO_AGENT_KEY": "the kolo CLI's client key",
                        "KOLO_AGENT_CA": "the kolo CLI's CA"}
            else:
                continue
            for name, what in want.items():
                if not env.get(name):
                    errors.append(f"{cname}: {name} is not set ({what})")
    for component in ("coordinator", "agent"):
        if component not in found:
            errors.append(f"mtls overlay renders no {component}")
    return errors


# ------------------------------------------------------------ gang scheduling

def parse_quantity(q):
    """A Kubernetes quantity as a float (cpu in cores, memory in bytes)."""
    s = str(q)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9,
             "T": 1e12, "m": 1e-3}
    for u in sorted(units, key=len, reverse=True):
        if s.endswith(u):
            return float(s[:-len(u)]) * units[u]
    return float(s)


def pod_requests(spec):
    """resource -> what one pod requests (requests, else limits: Kueue's rule)."""
    total = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        merged = dict(res.get("limits") or {})
        merged.update(res.get("requests") or {})
        for r, q in merged.items():
            total[r] = total.get(r, 0.0) + parse_quantity(q)
    return total


def check_training_job(job):
    """A kolo job's pods start together or the job cannot form: an Indexed
    Job of parallelism = completions = KOLO_PODS pods that fails at once."""
    errors = []
    jid = object_id(job)
    spec = job.get("spec") or {}
    pods = spec.get("parallelism")
    if spec.get("completionMode") != "Indexed":
        errors.append(f"{jid}: completionMode {spec.get('completionMode')}, want Indexed")
    if pods is None or spec.get("completions") != pods:
        errors.append(f"{jid}: parallelism {pods} != completions {spec.get('completions')}: "
                      "all pods of a kolo job run at once")
    if spec.get("backoffLimit") != 0:
        errors.append(f"{jid}: backoffLimit {spec.get('backoffLimit')}, want 0 (a retried pod "
                      "cannot rejoin a failed kolo job)")
    if pod_spec(job).get("restartPolicy") != "Never":
        errors.append(f"{jid}: restartPolicy {pod_spec(job).get('restartPolicy')}, want Never")
    for c in containers_of(job):
        env = {e.get("name"): e.get("value") for e in c.get("env") or []}
        if str(env.get("KOLO_PODS")) != str(pods):
            errors.append(f"{jid}[{c.get('name')}]: KOLO_PODS {env.get('KOLO_PODS')} != "
                          f"parallelism {pods}")
    return errors


def check_gang_coscheduling(objs):
    """scheduler-plugins coscheduling: the pods name a PodGroup of minMember
    = parallelism in their namespace, and a scheduler that is not the
    default one (which ignores pod groups)."""
    errors = []
    jobs = [o for o in objs if o.get("kind") == "Job"]
    groups = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objs
              if o.get("kind") == "PodGroup"}
    if not jobs:
        return ["gang-coscheduling overlay renders no Job"]
    for j in jobs:
        jid = object_id(j)
        errors += check_training_job(j)
        ns = j["metadata"].get("namespace")
        tlabels = (pod_template(j).get("metadata") or {}).get("labels") or {}
        gname = tlabels.get("scheduling.x-k8s.io/pod-group")
        sched = pod_spec(j).get("schedulerName")
        if not sched or sched == "default-scheduler":
            errors.append(f"{jid}: schedulerName {sched}: the default scheduler ignores pod "
                          "groups (want the scheduler-plugins scheduler)")
        if not gname:
            errors.append(f"{jid}: pods without the label scheduling.x-k8s.io/pod-group")
            continue
        g = groups.get((ns, gname))
        if g is None:
            errors.append(f"{jid}: pod group {gname} is no PodGroup in namespace {ns}")
            continue
        if g.get("apiVersion") != "scheduling.x-k8s.io/v1alpha1":
            errors.append(f"{object_id(g)}: apiVersion {g.get('apiVersion')}, want "
                          "scheduling.x-k8s.io/v1alpha1")
        mm = (g.get("spec") or {}).get("minMember")
        if mm != j["spec"].get("parallelism"):
            errors.append(f"{object_id(g)}: minMember {mm} != the Job's parallelism "
                          f"{j['spec'].get('parallelism')}: not all or nothing")
    return errors


def check_gang_kueue(objs):
    """Kueue: the Job is suspended, names a LocalQueue of its namespace whose
    ClusterQueue exists, covers every resource the pods request, with
    flavors that exist, and quota for all the Job's pods at once."""
    errors = []
    by = {}
    for o in objs:
        by.setdefault(o.get("kind"), {})[((o["metadata"].get("namespace")),
                                          o["metadata"]["name"])] = o
    jobs = list((by.get("Job") or {}).values())
    if not jobs:
        return ["gang-kueue overlay renders no Job"]
    for j in jobs:
        jid = object_id(j)
        errors += check_training_job(j)
        ns = j["metadata"].get("namespace")
        if j["spec"].get("suspend") is not True:
            errors.append(f"{jid}: suspend is not true: without Kueue's webhook it would run "
                          "unadmitted")
        qname = labels_of(j).get("kueue.x-k8s.io/queue-name")
        if not qname:
            errors.append(f"{jid}: no label kueue.x-k8s.io/queue-name")
            continue
        lq = (by.get("LocalQueue") or {}).get((ns, qname))
        if lq is None:
            errors.append(f"{jid}: queue {qname} is no LocalQueue in namespace {ns}")
            continue
        cqname = (lq.get("spec") or {}).get("clusterQueue")
        cq = (by.get("ClusterQueue") or {}).get((None, cqname))
        if cq is None:
            errors.append(f"{object_id(lq)}: clusterQueue {cqname} is no ClusterQueue")
            continue
        sel = ((cq.get("spec") or {}).get("namespaceSelector") or {}).get("matchLabels")
        if sel and sel.get("kubernetes.io/metadata.name", ns) != ns:
            errors.append(f"{object_id(cq)}: namespaceSelector {sel} leaves out {ns}")
        need = {r: q * j["spec"].get("parallelism", 1)
                for r, q in pod_requests(pod_spec(j)).items()}
        quota, covered = {}, set()
        for rg in (cq.get("spec") or {}).get("resourceGroups") or []:
            covered |= set(rg.get("coveredResources") or [])
            for fl in rg.get("flavors") or []:
                if (None, fl.get("name")) not in (by.get("ResourceFlavor") or {}):
                    errors.append(f"{object_id(cq)}: flavor {fl.get('name')} is no "
                                  "ResourceFlavor")
                for r in fl.get("resources") or []:
                    quota[r["name"]] = quota.get(r["name"], 0.0) + \
                        parse_quantity(r.get("nominalQuota", 0))
        for r, q in need.items():
            if r not in covered:
                errors.append(f"{object_id(cq)}: does not cover {r}, which {jid}'s pods "
                              "request: Kueue does not admit it")
            elif quota.get(r, 0.0) < q:
                errors.append(f"{object_id(cq)}: quota {r} {quota.get(r, 0.0):g} < the "
                              f"{q:g} of {jid}'s {j['spec'].get('parallelism')} pods: never "
                              "admitted")
    return errors


MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"


def gpu_request(c):
    res = c.get("resources") or {}
    return (res.get("limits") or {}).get("nvidia.com/gpu") or \
        (res.get("requests") or {}).get("nvidia.com/gpu")


def mps_host_dir(spec, c):
    """The hostPath behind the container's CUDA_MPS_PIPE_DIRECTORY, or None."""
    env = {e.get("name"): e.get("value") for e in c.get("env") or []}
    pipe = env.get(MPS_PIPE_ENV)
    mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
    vols = {v.get("name"): v for v in spec.get("volumes") or []}
    vol = vols.get(mounts.get(pipe)) or {}
    return (vol.get("hostPath") or {}).get("path")


def check_gpu_containers(w, want_hostpid=True):
    """GPU pods: the nvidia runtime, a GPU request for every container that
    sees GPUs (never NVIDIA_VISIBLE_DEVICES=all without one), the node's MPS
    pipe directory shared through a hostPath, hostPID/hostIPC."""
    errors = []
    spec = pod_spec(w)
    if spec.get("runtimeClassName") != "nvidia":
        errors.append(f"{object_id(w)}: GPU pods need runtimeClassName: nvidia")
    for k in ("hostPID", "hostIPC"):
        if want_hostpid and spec.get(k) is not True:
            errors.append(f"{object_id(w)}: {k}: true missing (CUDA IPC events / MPS)")
    for c in containers_of(w, init=True):
        env = {e.get("name"): e.get("value") for e in c.get("env") or []}
        if env.get("NVIDIA_VISIBLE_DEVICES") == "all" and not gpu_request(c):
            errors.append(f"{object_id(w)}[{c.get('name')}]: NVIDIA_VISIBLE_DEVICES=all without "
                          "a nvidia.com/gpu request (every GPU, unaccounted; refused on "
                          "hardened clusters)")
    for c in containers_of(w):
        if not gpu_request(c):
            errors.append(f"{object_id(w)}[{c.get('name')}]: no nvidia.com/gpu request")
        host = mps_host_dir(spec, c)
        if host != "/run/kolo-mps":
            errors.append(f"{object_id(w)}[{c.get('name')}]: {MPS_PIPE_ENV} is not the node's "
                          f"/run/kolo-mps (hostPath), got {host}")
    return errors


def check_gpu_overlay(objs):
    errors = []
    ds = [o for o in objs if o.get("kind") == "DaemonSet"]
    if not ds:
        return ["gpu overlay renders no DaemonSet"]
    for d in ds:
        errors += check_gpu_containers(d)
        for c in containers_of(d):
            if "nvidia-cuda-mps-control" not in " ".join(c.get("command") or []):
                errors.append(f"{object_id(d)}[{c.get('name')}]: does not start "
                              "nvidia-cuda-mps-control (the node's MPS daemon)")
            # The overlay's requirement (time-slicing replicas: 2), stated
            # and checked: KOLO_NODE_GPUS = the request, and the command
            # compares it with the distinct GPUs the pod sees.
            env = {e.get("name"): e.get("value") for e in c.get("env") or []}
            if str(env.get("KOLO_NODE_GPUS")) != str(gpu_request(c)):
                errors.append(f"{object_id(d)}[{c.get('name')}]: KOLO_NODE_GPUS "
                              f"{env.get('KOLO_NODE_GPUS')} != its nvidia.com/gpu request {gpu_request(c)} "
                              "(one time-sliced replica of each of the node's GPUs)")
            script = " ".join(c.get("command") or [])
            if "nvidia-smi -L" not in script or "KOLO_NODE_GPUS" not in script:
                errors.append(f"{object_id(d)}[{c.get('name')}]: does not check that the pod sees "
                              "KOLO_NODE_GPUS distinct GPUs (the time-slicing requirement)")
            if not (c.get("image") or "").startswith("kolo-agent-cuda"):
                errors.append(f"{object_id(d)}[{c.get('name')}]: image {c.get('image')} is not "
                              "the CUDA agent image (kolo-agent-cuda)")
    return errors


def check_gpu_training_overlay(objs):
    errors = []
    jobs = [o for o in objs if o.get("kind") == "Job"]
    if not jobs:
        return ["gpu-training overlay renders no Job"]
    for j in jobs:
        errors += check_gpu_containers(j)
        spec = pod_spec(j)
        uid = (spec.get("securityContext") or {}).get("runAsUser")
        if uid != KOLO_UID:
            errors.append(f"{object_id(j)}: trainers run as {uid}: CUDA MPS serves one uid at a "
                          f"time, the agent's is {KOLO_UID}")
        for c in containers_of(j):
            env = {e.get("name"): e.get("value") for e in c.get("env") or []}
            if str(gpu_request(c)) != str(env.get("KOLO_SLOTS", "1")):
                errors.append(f"{object_id(j)}[{c.get('name')}]: KOLO_SLOTS "
                              f"{env.get('KOLO_SLOTS')} != GPUs requested {gpu_request(c)}")
            elif str(env.get("KOLO_SLOTS", "1")) != "1":
                errors.append(f"{object_id(j)}[{c.get('name')}]: KOLO_SLOTS "
                              f"{env.get('KOLO_SLOTS')}: ranks on different GPUs of one node "
                              "are not wired yet (docs/gpu.md): one GPU, one rank per pod")
    return errors


# ----------------------------------------------------------------- container

def dockerfile_instructions(text):
    """[(INSTRUCTION, args)] with continuation lines joined."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        parts = buf.strip().split(None, 1)
        out.append((parts[0].upper(), parts[1] if len(parts) > 1 else ""))
        buf = ""
    return out


def check_dockerfile(root, text):
    errors = []
    ins = dockerfile_instructions(text)
    args = {}
    stages = {}  # name -> list of instructions
    order = []
    cur = None
    for op, rest in ins:
        if op == "ARG" and cur is None:
            k, _, v = rest.partition("=")
            args[k.strip()] = v.strip().strip('"')
        if op == "FROM":
            m = re.match(r"^(\S+)(?:\s+AS\s+(\S+))?$", rest.strip(), re.I)
            if not m:
                errors.append(f"FROM {rest}: cannot parse")
                continue
            image = re.sub(r"\$\{(\w+)\}", lambda mm: args.get(mm.group(1), ""), m.group(1))
            name = m.group(2) or f"stage{len(order)}"
            cur = name
            order.append(name)
            stages[name] = [("FROM", image)]
            continue
        if cur is not None:
            stages[cur].append((op, rest))
    for want in ("build", "runtime", "agent", "coordinator"):
        if want not in stages:
            errors.append(f"Dockerfile has no '{want}' stage")
    if errors:
        return errors
    for name in order:
        image = stages[name][0][1]
        if image not in stages and not re.match(r"^debian:(12|bookworm)([-.:].*)?$", image):
            errors.append(f"stage {name} is FROM {image}, want Debian 12 (debian:12*)")

    def stage_ops(name, op):
        return [r for o, r in stages[name] if o == op]

    def lineage(name):
        chain = []
        while name in stages:
            chain.append(name)
            name = stages[name][0][1]
        return chain

    entry = {"agent": "/usr/bin/kolo-agent", "coordinator": "/usr/bin/kolo-coordinator"}
    ports = {"agent": {PORT_AGENT_RPC, PORT_AGENT_METRICS}, "coordinator": {PORT_COORDINATOR}}
    for stage, exe in entry.items():
        eps = stage_ops(stage, "ENTRYPOINT")
        if not eps:
            errors.append(f"stage {stage}: no ENTRYPOINT")
        else:
            try:
                ep = json.loads(eps[-1])
                if not isinstance(ep, list) or ep[:1] != [exe]:
                    errors.append(f"stage {stage}: ENTRYPOINT {eps[-1]} does not run {exe}")
            except ValueError:
                errors.append(f"stage {stage}: ENTRYPOINT must be exec (JSON) form")
        exposed = set()
        for e in stage_ops(stage, "EXPOSE"):
            exposed |= {int(p.split("/")[0]) for p in e.split()}
        if exposed != ports[stage]:
            errors.append(f"stage {stage}: EXPOSE {sorted(exposed)}, want {sorted(ports[stage])}")
        users = [u for s in reversed(lineage(stage)) for u in stage_ops(s, "USER")]
        if not users or users[-1].split(":")[0] in ("root", "0"):
            errors.append(f"stage {stage}: runs as root (want USER {KOLO_UID})")
        elif users[-1].split(":")[0] not in (str(KOLO_UID), "kolo"):
            errors.append(f"stage {stage}: USER {users[-1]}, want {KOLO_UID}")
    if f"--uid {KOLO_UID}" not in " ".join(stage_ops("runtime", "RUN")):
        errors.append(f"runtime stage does not create the kolo user with uid {KOLO_UID}")

    def apt_packages(stage):
        pkgs = set()
        for r in stage_ops(stage, "RUN"):
            for m in re.finditer(r"apt-get install ([^&;|]*)", r):
                pkgs |= {w for w in m.group(1).split() if not w.startswith("-")}
        return pkgs
    build_pkgs = apt_packages("build")
    deps = os.path.join(root, "cmake", "KoloDependencies.cmake")
    if os.path.isfile(deps):
        with open(deps) as f:
            for m in re.finditer(r"apt-get install ([a-z0-9+.\- ]+)", f.read()):
                for pkg in m.group(1).split():
                    if pkg not in build_pkgs:
                        errors.append(f"build stage does not install {pkg} "
                                      "(cmake/KoloDependencies.cmake asks for it)")
    for stage in order:
        if stage == "build":
            continue
        for pkg in apt_packages(stage):
            if pkg.endswith("-dev"):
                errors.append(f"stage {stage} installs development package {pkg}")
    for stage in order:
        for r in stage_ops(stage, "COPY"):
            words = r.split()
            if any(w.startswith("--from=") for w in words):
                src = [w for w in words if w.startswith("--from=")][0][7:]
                if src not in stages:
                    errors.append(f"COPY --from={src}: no such stage")
                continue
            for src in [w for w in words if not w.startswith("--")][:-1]:
                if src != "." and not os.path.exists(os.path.join(root, src)):
                    errors.append(f"COPY {src}: not in the repository")
        for r in stage_ops(stage, "RUN"):
            for m in re.finditer(r"(deploy/\S+\.sh)", r):
                if not os.path.isfile(os.path.join(root, m.group(1))):
                    errors.append(f"RUN uses {m.group(1)}, which does not exist")
    errors += check_trainer_stage(root, stages, lineage, stage_ops)
    if order and order[-1] != "agent":
        errors.append(f"the last stage (docker build's default target) is {order[-1]}, want agent")
    ignore = os.path.join(root, "deploy", "container", "Dockerfile.dockerignore")
    if not os.path.isfile(ignore):
        errors.append("deploy/container/Dockerfile.dockerignore missing")
    else:
        with open(ignore) as f:
            entries = {l.strip() for l in f if l.strip() and not l.startswith("#")}
        for want in (".git", "build", "build-*"):
            if want not in entries:
                errors.append(f"Dockerfile.dockerignore does not exclude {want}")
    return errors


def check_trainer_stage(root, stages, lineage, stage_ops):
    """The trainer image (docs/kubernetes.md): on the runtime stage (libkolo,
    kolorun), Python with scripts/python-requirements.txt's torch pin and the
    kolo package installed with the built libkolo, checked by an import, run
    as the kolo user with $KOLO_PYTHON set."""
    errors = []
    if "trainer" not in stages:
        return ["Dockerfile has no 'trainer' stage (a PyTorch trainer image with the kolo package)"]
    if "runtime" not in lineage("trainer"):
        errors.append("stage trainer is not built on the runtime stage (libkolo, kolorun)")
    runs = " ".join(stage_ops("trainer", "RUN"))
    copies = " ".join(stage_ops("trainer", "COPY"))
    if "scripts/python-requirements.txt" not in copies or "pin torch" not in runs:
        errors.append("stage trainer does not install torch at scripts/python-requirements.txt's pin")
    if "client_lib/python" not in copies or not re.search(r"pip install [^&]*/tmp/kolo-python", runs):
        errors.append("stage trainer does not pip install the kolo package (client_lib/python)")
    if "KOLO_LIBRARY=" not in runs:
        errors.append("stage trainer installs the kolo package without the built libkolo (KOLO_LIBRARY)")
    if "import kolo, kolo.torch" not in runs:
        errors.append("stage trainer does not check that kolo.torch imports")
    if "KOLO_PYTHON=/opt/kolo/venv/bin/python" not in " ".join(stage_ops("trainer", "ENV")):
        errors.append("stage trainer does not set KOLO_PYTHON")
    users = stage_ops("trainer", "USER")
    if not users or users[-1].split(":")[0] not in (str(KOLO_UID), "kolo"):
        errors.append(f"stage trainer: runs as root (want USER {KOLO_UID} last)")
    req = os.path.join(root, "scripts", "python-requirements.txt")
    if not os.path.isfile(req) or not re.search(r"^torch==", open(req).read(), re.M):
        errors.append("scripts/python-requirements.txt has no torch== pin for the trainer image")
    return errors


def check_dockerfile_cuda(cpu_text, text):
    """Dockerfile.cuda (not built here: no docker): NVIDIA's devel image to
    build, its runtime image to run, CUDA and NCCL on, the CPU Dockerfile's
    build packages, the same kolo user, no GPU unless requested."""
    errors = []
    ins = dockerfile_instructions(text)
    froms = [rest for op, rest in ins if op == "FROM"]
    names = [re.split(r"\s+AS\s+", f, flags=re.I)[-1] for f in froms]
    for want in ("build", "runtime", "agent"):
        if want not in names:
            errors.append(f"Dockerfile.cuda has no '{want}' stage")
    if not any(f.startswith("nvidia/cuda:") and "-devel-" in f for f in froms):
        errors.append("Dockerfile.cuda: the build stage must be FROM nvidia/cuda:*-devel-*")
    if not any(f.startswith("nvidia/cuda:") and "-runtime-" in f for f in froms):
        errors.append("Dockerfile.cuda: the runtime stage must be FROM nvidia/cuda:*-runtime-*")
    runs = " ".join(rest for op, rest in ins if op == "RUN")
    for flag in ("-DKOLO_WITH_CUDA=ON", "-DKOLO_WITH_NCCL=ON", "runtime-deps.sh"):
        if flag not in runs:
            errors.append(f"Dockerfile.cuda: {flag} missing")

    def apt(t):
        pk = set()
        for op, rest in dockerfile_instructions(t):
            if op == "RUN" and "apt-get install" in rest:
                pk |= {w for w in rest.split() if re.match(r"^[a-z0-9][a-z0-9+.-]+$", w)}
        return pk
    missing = sorted(p for p in apt(cpu_text) - apt(text) if p.startswith("lib") or "-dev" in p)
    if missing:
        errors.append(f"Dockerfile.cuda: build packages of the CPU Dockerfile missing: {missing}")
    if not any(op == "USER" and rest.strip() == f"{KOLO_UID}:{KOLO_UID}" for op, rest in ins):
        errors.append(f"Dockerfile.cuda: USER {KOLO_UID}:{KOLO_UID} missing")
    if not any(op == "ENV" and "NVIDIA_VISIBLE_DEVICES=void" in rest for op, rest in ins):
        errors.append("Dockerfile.cuda: ENV NVIDIA_VISIBLE_DEVICES=void missing (NVIDIA's images "
                      "say all: every GPU to every container)")
    return errors


def check_runtime_deps(root):
    script = os.path.join(root, "deploy", "container", "runtime-deps.sh")
    if not os.path.isfile(script):
        return ["deploy/container/runtime-deps.sh missing"]
    if not (shutil.which("dpkg-query") and shutil.which("ldd")):
        return None
    sample = shutil.which("ls")
    with tempfile.TemporaryDirectory(prefix="kolo-stage-") as stage:
        os.makedirs(os.path.join(stage, "usr", "bin"))
        shutil.copy(sample, os.path.join(stage, "usr", "bin", "sample"))
        with open(os.path.join(stage, "usr", "bin", "not-elf"), "w") as f:
            f.write("#!/bin/sh\n")
        rc, out = run_tool(["sh", script, stage])
    pkgs = out.split()
    if rc != 0 or "libc6" not in pkgs:
        return [f"runtime-deps.sh on {sample}: rc {rc}, output {out.strip()!r} "
                "(expected a package list with libc6)"]
    return []


# ---------------------------------------------------------------------- docs

DOC_TERMS = ["/run/kolo/agent.sock", "7470", "7471", "7472", "grpc.health.v1",
             "KOLO_LOG_LEVEL", "KOLO_LOG_FORMAT", "kolo job", "stall", "journalctl",
             "systemctl", "kubectl", "upgrad", "token", "socket-mode", "memfd"]


def check_docs(root):
    path = os.path.join(root, "docs", "operations.md")
    if not os.path.isfile(path):
        return ["docs/operations.md missing"]
    with open(path) as f:
        text = f.read()
    return [f"docs/operations.md never mentions '{t}'" for t in DOC_TERMS if t not in text]


# ------------------------------------------------------------------- driver

def validate(root, bins, report):
    units = load_units(root)
    print("systemd")
    report.section("unit files present",
                   [f"missing deploy/systemd/{n}" for n in
                    ("kolo-agent.service", "kolo-coordinator.service", MPS_UNIT)
                    if n not in units])
    for name, text in units.items():
        if name == MPS_UNIT:
            report.section(f"{name} properties", check_mps_unit(text, units.get("kolo-agent.service")))
        else:
            report.section(f"{name} properties", check_unit_static(name, text))
    with tempfile.TemporaryDirectory(prefix="kolo-units-") as tmp:
        errs = verify_units(units, tmp)
        if errs is None:
            report.skip("systemd-analyze verify", "systemd-analyze is not installed")
        else:
            report.section("systemd-analyze verify", errs)
            errs = security_units({n: t for n, t in units.items() if n != MPS_UNIT}, tmp)
            if errs is None:
                report.skip("systemd-analyze security", "this systemd has no --offline mode")
            else:
                report.section("systemd-analyze security --offline", errs)
    errs, ran = check_sysusers(root, units)
    if ran or errs:
        report.section("sysusers", errs)
    else:
        report.skip("sysusers", "systemd-sysusers is not installed")

    print("config")
    report.section("config examples", check_conf_examples(root))
    kerrs, kustomizations = check_kustomizations(root)
    berrs, objs = base_objects(root, kustomizations)
    confmaps = {}
    for o in objs:
        if o.get("kind") == "ConfigMap":
            for key, text in (o.get("data") or {}).items():
                if key.endswith(".conf"):
                    confmaps[key] = (o["metadata"]["name"], text)
    for daemon in ("agent", "coordinator"):
        label = f"kolo-{daemon}"
        binary = bins.get(label)
        if not binary or not os.access(binary, os.X_OK):
            report.skip(f"{label} knobs", f"{label} is not built ({binary or 'no --bin'}); "
                        "config files not checked against its --dump-config")
            continue
        example = os.path.join(root, "deploy", "config", f"{daemon}.conf.example")
        errs = []
        if os.path.isfile(example):
            with open(example) as f:
                errs += check_conf_against_binary(binary, label, f.read(),
                                                  f"{daemon}.conf.example", True)
        if f"{daemon}.conf" in confmaps:
            cm, text = confmaps[f"{daemon}.conf"]
            errs += check_conf_against_binary(binary, label, text, f"ConfigMap {cm}", False)
        report.section(f"{label} knobs (--dump-config)", errs)

    print("kubernetes")
    report.section("kustomizations", kerrs)
    report.section("manifests (required fields)", berrs)
    report.section("manifests (selectors, services, probes, volumes)",
                   check_objects(objs, "base"))
    report.section("images and uid", check_images_listed(objs, kustomizations) +
                   check_k8s_uid(objs))
    for dirpath, _ in kustomizations:
        rel = os.path.relpath(dirpath, root)
        rendered, why = render_kustomization(dirpath)
        if rendered is None and why and "not installed" in why:
            report.skip(f"kustomize {rel}", why)
            continue
        if rendered is None:
            report.section(f"kustomize {rel}", [why])
            continue
        errs = []
        for i, o in enumerate(rendered):
            errs += check_required_fields(o, f"{rel} (rendered #{i})", None)
        errs += check_objects(rendered, f"{rel} (rendered)")
        if os.path.basename(dirpath) == "gpu":
            errs += check_gpu_overlay(rendered)
        if os.path.basename(dirpath) == "gpu-training":
            errs += check_gpu_training_overlay(rendered)
        errs += check_tls_files(rendered)
        if os.path.basename(dirpath) == "mtls":
            errs += check_mtls_overlay(rendered)
        if os.path.basename(dirpath) == "gang-coscheduling":
            errs += check_gang_coscheduling(rendered)
        elif os.path.basename(dirpath) == "gang-kueue":
            errs += check_gang_kueue(rendered)
        else:
            for j in (o for o in rendered if o.get("kind") == "Job"):
                errs += check_training_job(j)
        report.section(f"kustomize {rel} (rendered)", errs)

    print("container")
    dockerfile = os.path.join(root, "deploy", "container", "Dockerfile")
    if os.path.isfile(dockerfile):
        with open(dockerfile) as f:
            report.section("Dockerfile", check_dockerfile(root, f.read()))
    else:
        report.section("Dockerfile", ["deploy/container/Dockerfile missing"])
    cuda = os.path.join(root, "deploy", "container", "Dockerfile.cuda")
    if os.path.isfile(cuda) and os.path.isfile(dockerfile):
        with open(dockerfile) as f, open(cuda) as g:
            report.section("Dockerfile.cuda (structure; not built)",
                           check_dockerfile_cuda(f.read(), g.read()))
    else:
        report.section("Dockerfile.cuda", ["deploy/container/Dockerfile.cuda missing"])
    errs = check_runtime_deps(root)
    if errs is None:
        report.skip("runtime-deps.sh", "dpkg-query or ldd is not installed")
    else:
        report.section("runtime-deps.sh", errs)

    print("docs")
    report.section("docs/operations.md", check_docs(root))


# ---------------------------------------------------------------- self-test

def self_test(root):
    """Each known breakage must be reported by the check that owns it."""
    failures = []

    def expect(name, errors):
        if errors:
            print(f"  detected: {name}: {errors[0]}")
        else:
            failures.append(name)
            print(f"  MISSED:   {name}")

    _, kustomizations = check_kustomizations(root)
    _, objs = base_objects(root, kustomizations)
    baseline = check_objects(objs, "base")
    if baseline:
        print("self-test needs clean manifests; base has errors:", baseline)
        return 1

    def mutate(fn):
        o2 = copy.deepcopy(objs)
        fn(o2)
        return check_objects(o2, "mutated")

    def find(o2, kind, component):
        return [o for o in o2 if o.get("kind") == kind and
                labels_of(o).get(LABEL_COMPONENT) == component][0]

    def svc_selector(o2):
        find(o2, "Service", "coordinator")["spec"]["selector"][LABEL_COMPONENT] = "nope"
    expect("Service selector matching no pod", mutate(svc_selector))

    def tmpl_label(o2):
        pod_template(find(o2, "Deployment", "coordinator"))["metadata"]["labels"][
            LABEL_COMPONENT] = "other"
    expect("Deployment selector not matching its pod labels", mutate(tmpl_label))

    def ds_selector(o2):
        find(o2, "DaemonSet", "agent")["spec"]["selector"]["matchLabels"]["extra"] = "x"
    expect("DaemonSet selector not matching its pod labels", mutate(ds_selector))

    def http_probe(o2):
        c = containers_of(find(o2, "DaemonSet", "agent"))[0]
        c["livenessProbe"] = {"httpGet": {"path": "/", "port": PORT_AGENT_METRICS}}
    expect("non-grpc probe", mutate(http_probe))

    def tls_grpc_probe(o2):
        c = containers_of(find(o2, "DaemonSet", "agent"))[0]
        c.setdefault("env", []).append({"name": "KOLO_RPC_TLS_CERT", "value": "/etc/tls/tls.crt"})
    expect("TLS on with the kubelet's (plain-text) gRPC probes", mutate(tls_grpc_probe))

    def probe_port(o2):
        c = containers_of(find(o2, "Deployment", "coordinator"))[0]
        c["readinessProbe"]["grpc"]["port"] = 9999
    expect("grpc probe on an undeclared port", mutate(probe_port))

    def no_liveness(o2):
        c = containers_of(find(o2, "Deployment", "coordinator"))[0]
        del c["livenessProbe"]
    expect("missing liveness probe", mutate(no_liveness))

    def target_port(o2):
        find(o2, "Service", "agent")["spec"]["ports"][0]["targetPort"] = "nope"
    expect("Service targetPort not a containerPort", mutate(target_port))

    def coord_env(o2):
        c = containers_of(find(o2, "DaemonSet", "agent"))[0]
        for e in c["env"]:
            if e["name"] == "KOLO_COORDINATOR":
                e["value"] = "kolo-coord:7470"
    expect("KOLO_COORDINATOR naming no Service", mutate(coord_env))

    def coord_port(o2):
        c = containers_of(find(o2, "DaemonSet", "agent"))[0]
        for e in c["env"]:
            if e["name"] == "KOLO_COORDINATOR":
                e["value"] = "kolo-coordinator:1234"
    expect("KOLO_COORDINATOR with a port the Service lacks", mutate(coord_port))

    def cm_port(o2):
        cm = find(o2, "ConfigMap", "agent")
        cm["data"]["agent.conf"] = cm["data"]["agent.conf"].replace(
            f":{PORT_AGENT_RPC}", ":7999")
    expect("agent.conf rpc-listen port not declared / not probed", mutate(cm_port))

    def cm_no_admin_token(o2):
        cm = find(o2, "ConfigMap", "agent")
        cm["data"]["agent.conf"] = re.sub(r"^\s*rpc-auth-token-file\s*=.*\n", "",
                                          cm["data"]["agent.conf"], flags=re.M)
    expect("agent.conf serving the pod network without rpc-auth-token-file",
           mutate(cm_no_admin_token))

    def cm_loopback_rpc(o2):
        cm = find(o2, "ConfigMap", "agent")
        cm["data"]["agent.conf"] = re.sub(r"^(\s*rpc-listen\s*=).*$", r"\1 127.0.0.1:7471",
                                          cm["data"]["agent.conf"], flags=re.M)
    expect("agent.conf rpc-listen on loopback with gRPC probes", mutate(cm_loopback_rpc))

    def token_not_secret(o2):
        ds = find(o2, "DaemonSet", "agent")
        for v in pod_spec(ds)["volumes"]:
            if "secret" in v:
                del v["secret"]
                v["emptyDir"] = {}
    expect("rpc-auth-token-file not in a mounted Secret", mutate(token_not_secret))

    def cm_missing(o2):
        o2.remove(find(o2, "ConfigMap", "coordinator"))
    expect("volume referencing a missing ConfigMap", mutate(cm_missing))

    def pvc_missing(o2):
        o2.remove(find(o2, "PersistentVolumeClaim", "coordinator"))
    expect("volume referencing a missing PVC", mutate(pvc_missing))

    def socket_mount(o2):
        ds = find(o2, "DaemonSet", "agent")
        for v in pod_spec(ds)["volumes"]:
            if "hostPath" in v:
                v["hostPath"]["path"] = "/var/run/other"
    expect("socket directory not a hostPath of the same path", mutate(socket_mount))

    def undeclared_volume(o2):
        c = containers_of(find(o2, "DaemonSet", "agent"))[0]
        c["volumeMounts"].append({"name": "ghost", "mountPath": "/ghost"})
    expect("volumeMount of an undeclared volume", mutate(undeclared_volume))

    o_ns = copy.deepcopy(objs)
    del find(o_ns, "Service", "coordinator")["metadata"]["namespace"]
    expect("namespaced object without namespace",
           check_required_fields(find(o_ns, "Service", "coordinator"), "mutated", "kolo-system"))
    expect("image not in kustomization images",
           check_images_listed(objs, [("x", {"images": [{"name": "kolo-agent"}]})]))

    _, _, perrs = parse_conf("socket = /run/kolo/agent.sock\nthis is not a knob\n", "t.conf")
    expect("config line that is not 'name = value'", perrs)
    _, _, perrs = parse_conf("socket = a\nsocket = b\n", "t.conf")
    expect("knob set twice", perrs)

    units = load_units(root)
    mps, agent_unit = units.get(MPS_UNIT, ""), units.get("kolo-agent.service", "")
    if check_mps_unit(mps, agent_unit):
        failures.append("kolo-mps.service is not clean to start with")
    for what, m, a in [
            ("kolo-mps.service daemonizing (-d)", mps.replace("control -f", "control -d"), agent_unit),
            ("kolo-mps.service with another pipe directory than the agent's",
             mps.replace("CUDA_MPS_PIPE_DIRECTORY=/run/kolo-mps", "CUDA_MPS_PIPE_DIRECTORY=/tmp/x"),
             agent_unit),
            ("kolo-agent.service without the MPS pipe directory", mps,
             agent_unit.replace("Environment=CUDA_MPS_PIPE_DIRECTORY=/run/kolo-mps\n", "")),
            ("kolo-mps.service as another user than the agent (MPS serves one uid)",
             mps.replace("User=kolo", "User=root"), agent_unit),
            ("kolo-mps.service after the agent", mps.replace("Before=kolo-agent.service", ""),
             agent_unit),
            ("kolo-mps.service on nodes without a GPU",
             mps.replace("ConditionPathExists=/dev/nvidiactl", ""), agent_unit),
            ("kolo-mps.service without ExecStop quit",
             re.sub(r"^ExecStop=.*\n", "", mps, flags=re.M), agent_unit)]:
        expect(what, check_mps_unit(m, a))
    for name, text in units.items():
        if name == MPS_UNIT:
            continue
        broken = text.replace("Type=notify", "Type=simple")
        expect(f"{name} with Type=simple", check_unit_static(name, broken))
        broken = re.sub(r"^RestrictAddressFamilies=.*$", "RestrictAddressFamilies=AF_UNIX",
                        text, flags=re.M)
        expect(f"{name} with narrowed RestrictAddressFamilies", check_unit_static(name, broken))
        broken = re.sub(r"^Restart=.*$", "Restart=no", text, flags=re.M)
        expect(f"{name} with Restart=no", check_unit_static(name, broken))
        broken = re.sub(r"^RestartSec=.*$", "RestartSec=0", text, flags=re.M)
        expect(f"{name} with RestartSec=0", check_unit_static(name, broken))
        broken = re.sub(r"^StartLimitIntervalSec=.*$",
                        "StartLimitIntervalSec=300\nStartLimitBurst=10", text, flags=re.M)
        expect(f"{name} with a start limit a crash burst trips (300 s, 10)",
               check_unit_static(name, broken))
        broken = re.sub(r"^StartLimitIntervalSec=.*\n", "", text, flags=re.M)
        expect(f"{name} with systemd's default start limit (10 s, 5)",
               check_unit_static(name, broken))
        broken = re.sub(r"^StartLimitIntervalSec=.*\n", "", text, flags=re.M).replace(
            "[Service]\n", "[Service]\nStartLimitIntervalSec=0\n", 1)
        expect(f"{name} with StartLimitIntervalSec in [Service]", check_unit_static(name, broken))
        lenient = re.sub(r"^StartLimitIntervalSec=.*$",
                         "StartLimitIntervalSec=60\nStartLimitBurst=31", text, flags=re.M)
        if check_restart_policy(name, parse_unit(lenient)):
            failures.append(f"{name} with a burst above the restart pace (60 s, 31)")
            print(f"  MISSED:   {name}: a burst above the restart pace was refused")
        if shutil.which("systemd-analyze"):
            with tempfile.TemporaryDirectory(prefix="kolo-units-") as tmp:
                broken = text.replace("[Service]\n", "[Service]\nBogusKey=1\n", 1)
                expect(f"{name} with an unknown key (systemd-analyze verify)",
                       verify_units({name: broken}, tmp))
            with tempfile.TemporaryDirectory(prefix="kolo-units-") as tmp:
                broken = re.sub(r"^RestartSec=.*$", "RestartSec=soon", text, flags=re.M)
                expect(f"{name} with an unparsable RestartSec (systemd-analyze verify)",
                       verify_units({name: broken}, tmp))

    # The --dump-config comparison, against a stand-in daemon that knows two
    # knobs and rejects config files naming others (as common/config.cc does).
    with tempfile.TemporaryDirectory(prefix="kolo-fake-daemon-") as tmp:
        fake = os.path.join(tmp, "fake-daemon")
        with open(fake, "w") as f:
            f.write(FAKE_DAEMON.replace("#!/usr/bin/env python3", "#!" + sys.executable, 1))
        os.chmod(fake, 0o755)
        good = "# socket = /run/kolo/agent.sock\n# arena-mb = 1024\n"
        errs = check_conf_against_binary(fake, "fake", good, "good.conf", True)
        if errs:
            failures.append("fake daemon baseline")
            print(f"  MISSED:   fake daemon baseline reported {errs}")
        expect("documented knob the daemon does not have",
               check_conf_against_binary(fake, "fake", good + "# bogus-knob = 1\n",
                                         "t.conf", True))
        expect("documented default differing from the daemon's",
               check_conf_against_binary(fake, "fake", good.replace("1024", "2048"),
                                         "t.conf", True))
        expect("documented value the daemon rejects",
               check_conf_against_binary(fake, "fake", "arena-mb = lots\n", "t.conf", False))

    with open(os.path.join(root, "deploy", "container", "Dockerfile")) as f:
        dtext = f.read()
    expect("Dockerfile runtime stage as root",
           check_dockerfile(root, dtext.replace(f"USER {KOLO_UID}:{KOLO_UID}", "USER root")))
    expect("Dockerfile build stage missing libgrpc++-dev",
           check_dockerfile(root, dtext.replace(" libgrpc++-dev", "")))
    expect("Dockerfile agent ENTRYPOINT in shell form",
           check_dockerfile(root, dtext.replace('ENTRYPOINT ["/usr/bin/kolo-agent"]',
                                                "ENTRYPOINT /usr/bin/kolo-agent")))
    expect("Dockerfile without the trainer stage",
           check_dockerfile(root, dtext.replace("FROM runtime AS trainer", "FROM runtime AS other")))
    expect("Dockerfile trainer image without the kolo package",
           check_dockerfile(root, dtext.replace("/opt/kolo/venv/bin/pip install --no-cache-dir --no-build-isolation "
                                                "/tmp/kolo-python", "true")))
    expect("Dockerfile trainer image as root",
           check_dockerfile(root, re.sub(r"(ENV KOLO_PYTHON[^\n]*\n[^\n]*\n)USER 10001:10001", r"\1USER root",
                                         dtext)))
    expect("Dockerfile from a non-Debian-12 base",
           check_dockerfile(root, dtext.replace("debian:12-slim", "ubuntu:22.04")))

    with tempfile.TemporaryDirectory(prefix="kolo-kust-") as tmp:
        kdir = os.path.join(tmp, "deploy", "kubernetes")
        os.makedirs(kdir)
        with open(os.path.join(kdir, "kustomization.yaml"), "w") as f:
            f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                    "resources:\n  - missing.yaml\n")
        with open(os.path.join(kdir, "orphan.yaml"), "w") as f:
            f.write("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
        errs, _ = check_kustomizations(tmp)
        expect("kustomization listing a missing file", [e for e in errs if "missing.yaml" in e])
        expect("manifest not listed in its kustomization", [e for e in errs if "orphan" in e])

    # GPU overlays, rendered (kubectl or kustomize needed).
    kdir = os.path.join(root, "deploy", "kubernetes", "overlays")
    gpu, why = render_kustomization(os.path.join(kdir, "gpu"))
    train, why2 = render_kustomization(os.path.join(kdir, "gpu-training"))
    if gpu is None or train is None:
        print(f"  (GPU overlay breakages not tried: {why or why2})")
    else:
        if check_gpu_overlay(gpu) or check_gpu_training_overlay(train):
            print("self-test needs clean GPU overlays:", check_gpu_overlay(gpu),
                  check_gpu_training_overlay(train))
            return 1

        def gpu_mutate(objs_, kind, fn):
            o2 = copy.deepcopy(objs_)
            for o in o2:
                if o.get("kind") == kind:
                    fn(pod_spec(o), pod_spec(o)["containers"][0])
            return o2

        def visible_all(spec, c):
            c["resources"]["limits"].pop("nvidia.com/gpu")
            c["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})

        def no_mps_mount(spec, c):
            c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/run/kolo-mps"]

        def other_uid(spec, c):
            spec["securityContext"]["runAsUser"] = 10002

        def slots_mismatch(spec, c):
            c["resources"]["limits"]["nvidia.com/gpu"] = "2"

        expect("GPU agent with NVIDIA_VISIBLE_DEVICES=all and no GPU request",
               check_gpu_overlay(gpu_mutate(gpu, "DaemonSet", visible_all)))
        def gpus_mismatch(spec, c):
            c["resources"]["limits"]["nvidia.com/gpu"] = "4"

        expect("GPU agent whose KOLO_NODE_GPUS is not its GPU request",
               check_gpu_overlay(gpu_mutate(gpu, "DaemonSet", gpus_mismatch)))
        expect("GPU agent without the MPS pipe directory",
               check_gpu_overlay(gpu_mutate(gpu, "DaemonSet", no_mps_mount)))
        expect("GPU trainers without a GPU request",
               check_gpu_training_overlay(gpu_mutate(train, "Job", visible_all)))
        expect("GPU trainers under MPS with another uid than the agent's",
               check_gpu_training_overlay(gpu_mutate(train, "Job", other_uid)))
        expect("GPU trainers with KOLO_SLOTS != GPUs requested",
               check_gpu_training_overlay(gpu_mutate(train, "Job", slots_mismatch)))

        def two_gpus(spec, c):
            c["resources"]["limits"]["nvidia.com/gpu"] = "2"
            for e in c["env"]:
                if e["name"] == "KOLO_SLOTS":
                    e["value"] = "2"
        expect("GPU trainers on two GPUs of one node (not wired)",
               check_gpu_training_overlay(gpu_mutate(train, "Job", two_gpus)))
    # Mutual TLS and gang scheduling overlays, rendered.
    rendered = {}
    for name in ("mtls", "gang-coscheduling", "gang-kueue"):
        rendered[name], why = render_kustomization(os.path.join(kdir, name))
        if rendered[name] is None:
            print(f"  ({name} overlay breakages not tried: {why})")
    clean = {"mtls": check_mtls_overlay, "gang-coscheduling": check_gang_coscheduling,
             "gang-kueue": check_gang_kueue}
    for name, fn in clean.items():
        if rendered[name] is not None and fn(rendered[name]):
            print(f"self-test needs a clean {name} overlay:", fn(rendered[name]))
            return 1

    def kind_mutate(objs_, kind, fn):
        o2 = copy.deepcopy(objs_)
        for o in o2:
            if o.get("kind") == kind:
                fn(o)
        return o2

    def drop_env(name, component=None):
        def fn(o):
            if component and labels_of(o).get(LABEL_COMPONENT) != component:
                return
            for c in containers_of(o):
                c["env"] = [e for e in c.get("env") or [] if e.get("name") != name]
        return fn

    def unmount_client_tls(o):
        for c in containers_of(o):
            c["volumeMounts"] = [m for m in c.get("volumeMounts") or []
                                 if m.get("mountPath") != "/etc/kolo-client-tls"]

    mt = rendered["mtls"]
    if mt is not None:
        expect("mtls: coordinator without --tls-client-ca",
               check_mtls_overlay(kind_mutate(mt, "Deployment", drop_env("KOLO_TLS_CLIENT_CA"))))
        expect("mtls: agent without a client certificate for the coordinator",
               check_mtls_overlay(kind_mutate(mt, "DaemonSet", drop_env("KOLO_COORDINATOR_CERT"))))
        expect("mtls: agent's status service without --rpc-tls-client-ca",
               check_mtls_overlay(kind_mutate(mt, "DaemonSet",
                                              drop_env("KOLO_RPC_TLS_CLIENT_CA"))))
        expect("mtls: preStop drain's kolo without a client certificate",
               check_mtls_overlay(kind_mutate(mt, "DaemonSet", drop_env("KOLO_AGENT_KEY"))))
        expect("mtls: client certificate not mounted",
               check_mtls_overlay(kind_mutate(mt, "DaemonSet", unmount_client_tls)))
    cs = rendered["gang-coscheduling"]
    if cs is not None:
        def min_member(o):
            o["spec"]["minMember"] = 1
        expect("coscheduling: PodGroup minMember below the Job's parallelism",
               check_gang_coscheduling(kind_mutate(cs, "PodGroup", min_member)))
        expect("coscheduling: pods on the default scheduler",
               check_gang_coscheduling(kind_mutate(
                   cs, "Job", lambda o: pod_spec(o).pop("schedulerName"))))
        expect("coscheduling: pods without the pod-group label",
               check_gang_coscheduling(kind_mutate(
                   cs, "Job", lambda o: pod_template(o)["metadata"]["labels"].pop(
                       "scheduling.x-k8s.io/pod-group"))))
        expect("coscheduling: no PodGroup",
               check_gang_coscheduling([o for o in cs if o.get("kind") != "PodGroup"]))

        def half_parallel(o):
            o["spec"]["parallelism"] = 1
        expect("training Job with parallelism != completions",
               check_gang_coscheduling(kind_mutate(cs, "Job", half_parallel)))

        def retries(o):
            o["spec"]["backoffLimit"] = 3
        expect("training Job that retries pods (backoffLimit > 0)",
               check_gang_coscheduling(kind_mutate(cs, "Job", retries)))
    kq = rendered["gang-kueue"]
    if kq is not None:
        expect("kueue: Job not suspended",
               check_gang_kueue(kind_mutate(kq, "Job", lambda o: o["spec"].pop("suspend"))))
        expect("kueue: Job without a queue-name label",
               check_gang_kueue(kind_mutate(
                   kq, "Job", lambda o: o["metadata"]["labels"].pop("kueue.x-k8s.io/queue-name"))))

        def other_cq(o):
            o["spec"]["clusterQueue"] = "nowhere"
        expect("kueue: LocalQueue naming no ClusterQueue",
               check_gang_kueue(kind_mutate(kq, "LocalQueue", other_cq)))

        def small_quota(o):
            for r in o["spec"]["resourceGroups"][0]["flavors"][0]["resources"]:
                if r["name"] == "cpu":
                    r["nominalQuota"] = "1500m"
        expect("kueue: cpu quota below the Job's pods' requests",
               check_gang_kueue(kind_mutate(kq, "ClusterQueue", small_quota)))

        def no_memory(o):
            rg = o["spec"]["resourceGroups"][0]
            rg["coveredResources"].remove("memory")
            rg["flavors"][0]["resources"] = [r for r in rg["flavors"][0]["resources"]
                                             if r["name"] != "memory"]
        expect("kueue: ClusterQueue not covering memory",
               check_gang_kueue(kind_mutate(kq, "ClusterQueue", no_memory)))
        expect("kueue: no ResourceFlavor",
               check_gang_kueue([o for o in kq if o.get("kind") != "ResourceFlavor"]))

    with open(os.path.join(root, "deploy", "container", "Dockerfile")) as f:
        cpu_df = f.read()
    with open(os.path.join(root, "deploy", "container", "Dockerfile.cuda")) as f:
        cuda_df = f.read()
    if check_dockerfile_cuda(cpu_df, cuda_df):
        print("self-test needs a clean Dockerfile.cuda:", check_dockerfile_cuda(cpu_df, cuda_df))
        return 1
    expect("Dockerfile.cuda without NCCL",
           check_dockerfile_cuda(cpu_df, cuda_df.replace("-DKOLO_WITH_NCCL=ON", "-DKOLO_WITH_NCCL=OFF")))
    expect("Dockerfile.cuda missing a build package of the CPU image",
           check_dockerfile_cuda(cpu_df, cuda_df.replace("libgrpc++-dev", "")))
    expect("Dockerfile.cuda keeping NVIDIA_VISIBLE_DEVICES=all",
           check_dockerfile_cuda(cpu_df, cuda_df.replace("NVIDIA_VISIBLE_DEVICES=void", "X=1")))
    if failures:
        print(f"self-test: {len(failures)} breakage(s) went unnoticed: {failures}")
        return 1
    print("self-test: every breakage was detected")
    return 0


FAKE_DAEMON = r"""#!/usr/bin/env python3
import sys
knobs = {"socket": "/run/kolo/agent.sock", "arena-mb": "1024"}
args = sys.argv[1:]
if "--config" in args:
    for line in open(args[args.index("--config") + 1]):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        k, _, v = line.partition("=")
        k, v = k.strip(), v.strip()
        if k not in knobs:
            sys.exit("unknown key '%s'" % k)
        if k == "arena-mb" and not v.isdigit():
            sys.exit("arena-mb: expected an integer, got '%s'" % v)
        knobs[k] = v
if "--dump-config" in args:
    for k, v in knobs.items():
        print('%s = "%s"  # default' % (k, v) if not v.isdigit() else "%s = %s  # default" % (k, v))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.normpath(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")),
        help="repository root (default: two levels above this script)")
    ap.add_argument("--bin", action="append", default=[], metavar="NAME=PATH",
                    help="a built daemon (kolo-agent=..., kolo-coordinator=...)")
    ap.add_argument("--self-test", action="store_true",
                    help="check that the validator detects known breakages")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    if a.self_test:
        return self_test(root)
    bins = {}
    for b in a.bin:
        name, _, path = b.partition("=")
        bins[name] = path
    report = Report()
    validate(root, bins, report)
    print()
    print(f"{len(report.checked)} checks, {len(report.failures)} failure(s), "
          f"{len(report.skips)} skipped")
    for s in report.skips:
        print(f"  skipped {s}")
    for f in report.failures:
        print(f"  FAIL {f}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
