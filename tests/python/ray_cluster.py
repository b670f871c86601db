"""A real Ray cluster of raylets on this machine for test_ray.py and
test_ray_elastic.py (ray.cluster_utils.Cluster): a head with no CPU for
workers and `nodes` worker nodes of NODE_CPUS CPUs, every address on
loopback. After its shutdown no process of the cluster may be left
(raylets, GCS, workers: anything whose command line names its session
directory)."""

import contextlib
import os
import time

from conftest import PKG_DIR, WORKERS, build_dir

# Every Ray address on loopback: Ray takes 127.0.0.1 as this node's IP only
# so (read when ray is imported, hence before the import).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

NODE_CPUS = 2
MEM = 80 * 1024 * 1024


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def raylet_pid(node):
    return node.all_processes["raylet"][0].process.pid


def ray_pids(session_dir):
    """The live processes whose command line names session_dir."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit() and pid_alive(int(d)):
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    if session_dir.encode() in f.read():
                        found.append(int(d))
            except OSError:
                pass
    return found


def add_node(c):
    return c.add_node(num_cpus=NODE_CPUS, object_store_memory=MEM, node_ip_address="127.0.0.1")


@contextlib.contextmanager
def ray_cluster(nodes=2):
    """(cluster, [worker nodes]) with ray.init() connected to it; the
    environment kolo's actors need while it runs, restored after."""
    saved = dict(os.environ)
    os.environ.update({
        "PYTHONPATH": os.pathsep.join([PKG_DIR, WORKERS, os.path.dirname(WORKERS)]),
        "KOLO_LIBRARY": os.path.join(build_dir(), "lib", "libkolo.so"),
        "KOLO_BUILD_DIR": build_dir(), "KOLO_OP_TIMEOUT": "60", "OMP_NUM_THREADS": "1",
        "KOLO_RAY_COORDINATOR_HOST": "127.0.0.1", "RAY_USAGE_STATS_ENABLED": "0"})
    os.environ.pop("KOLO_AGENT_SOCKET", None)
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "object_store_memory": MEM,
        "node_ip_address": "127.0.0.1"})
    session = c.head_node.get_session_dir_path()
    try:
        workers = [add_node(c) for _ in range(nodes)]
        c.wait_for_nodes(timeout=60)
        ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
        yield c, workers
    finally:
        ray.shutdown()
        c.shutdown()
        os.environ.clear()
        os.environ.update(saved)  # the later test modules see the environment they had
    deadline = time.monotonic() + 30
    while ray_pids(session) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_pids(session) == [], "Ray processes left after the cluster's shutdown"
