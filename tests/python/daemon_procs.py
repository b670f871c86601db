"""The kolo-agent and kolo-coordinator processes a test started, found by a
marker in their command line (the private directory kolo.ray / kolo.spark
make: kolo-ray-..., kolo-spark-...). Other jobs' daemons on this machine
never match."""

import os
import time


def kolo_daemons(marker):
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % d) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z" or not argv or not argv[0]:
            continue
        prog = os.path.basename(argv[0].decode(errors="replace"))
        if prog in ("kolo-agent", "kolo-coordinator") and any(marker.encode() in a for a in argv):
            found.append((int(d), prog))
    return found


def wait_gone(marker, timeout):
    """[] once no such daemon is left (within timeout), else what is left."""
    deadline = time.monotonic() + timeout
    while True:
        left = kolo_daemons(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
