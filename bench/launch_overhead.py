"""Time from launch to the first allreduce, and per-step time, for one
kolo.torch function under kolorun (fixed and elastic), kolo.ray.RayExecutor,
kolo.ray.ElasticRayExecutor and kolo.spark.run on this machine (4 ranks, 2
"nodes"). docs/benchmarks.md, "Ray and Spark". Each line has the 1-minute
load average at its end (the machine is shared).

usage: KOLO_BUILD_DIR=build $KOLO_PYTHON bench/launch_overhead.py [steps [kolorun|ray|spark ...]]

Ray: a 3-raylet ray.cluster_utils.Cluster; Spark: a standalone master and
two workers on 127.0.0.2/.3 (as tests/python/test_ray.py, test_spark.py).
The clusters' own start is not counted: a user's cluster is already up.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "client_lib", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "python", "workers"))
BUILD = os.path.abspath(os.environ.get("KOLO_BUILD_DIR", os.path.join(REPO, "build")))
os.environ.update({"KOLO_LIBRARY": os.path.join(BUILD, "lib", "libkolo.so"), "KOLO_BUILD_DIR": BUILD,
                   "OMP_NUM_THREADS": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                   "RAY_USAGE_STATS_ENABLED": "0", "KOLO_RAY_COORDINATOR_HOST": "127.0.0.1",
                   "KOLO_SPARK_DRIVER_HOST": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                   "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "client_lib", "python"), HERE])})
os.environ.pop("KOLO_AGENT_SOCKET", None)

from launch_fn import steps_fn  # noqa: E402


def summarize(name, t_launch, res):
    first = max(r["first"] for r in res) - t_launch
    step_ms = 1000 * sum(r["per_step"] for r in res) / len(res)
    print(json.dumps({"launcher": name, "launch_to_first_allreduce_s": round(first, 2),
                      "per_step_ms": round(step_ms, 3), "loadavg_1m": os.getloadavg()[0]}), flush=True)


def bench_kolorun(steps):
    for name, extra in (("kolorun", []), ("kolorun elastic (--min-np 4)", ["--min-np", "4"])):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.time()
            subprocess.run([os.path.join(BUILD, "bin", "kolorun"), "-np", "4", "--agents", "2"] + extra +
                           [sys.executable, os.path.join(HERE, "launch_fn.py"), str(steps), d], check=True,
                           stdout=subprocess.DEVNULL)
            res = [json.load(open(os.path.join(d, "r%d.json" % r))) for r in range(4)]
        summarize(name, t0, res)


def bench_ray(steps):
    import ray
    from ray.cluster_utils import Cluster
    from kolo.ray import ElasticRayExecutor, RayExecutor
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                      "object_store_memory": 80 << 20})
    for _ in range(2):
        c.add_node(num_cpus=2, object_store_memory=80 << 20)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2, num_workers_per_host=2)
        t0 = time.time()
        ex.start()
        res = ex.run(steps_fn, args=(steps,))
        summarize("kolo.ray (start+run)", t0, res)
        t1 = time.time()
        summarize("kolo.ray (run on a started executor)", t1, ex.run(steps_fn, args=(steps,)))
        ex.shutdown()
        # 4 slots (2 nodes of 2 CPUs, cpus_per_slot=1): 2 workers and one agent per node
        ex = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=4, max_np=4, timeout_s=60))
        t0 = time.time()
        ex.start()
        summarize("kolo.ray elastic (start+run)", t0, ex.run(steps_fn, args=(steps,)))
        ex.shutdown()
    finally:
        ray.shutdown()
        c.shutdown()


def bench_spark(steps):
    import test_spark as ts  # its cluster fixture's pieces
    import pyspark
    from pyspark.sql import SparkSession
    import kolo.spark
    env = dict(os.environ, SPARK_HOME=os.path.dirname(pyspark.__file__), SPARK_DAEMON_MEMORY="256m",
               SPARK_LOCAL_IP="127.0.0.1")
    port, procs = ts.free_port(), []
    with tempfile.TemporaryDirectory() as d, open(os.path.join(d, "log"), "ab") as log:
        procs.append(ts.spark_daemon("org.apache.spark.deploy.master.Master",
                                     ["--host", "127.0.0.1", "--port", str(port), "--webui-port",
                                      str(ts.free_port())], log, env))
        for i, h in enumerate(ts.HOSTS):
            procs.append(ts.spark_daemon("org.apache.spark.deploy.worker.Worker",
                                         ["--host", h, "--cores", "2", "--memory", "1g", "--webui-port",
                                          str(ts.free_port()), "--work-dir", os.path.join(d, "w%d" % i),
                                          "spark://127.0.0.1:%d" % port], log, dict(env, SPARK_LOCAL_IP=h)))
        try:
            s = (SparkSession.builder.master("spark://127.0.0.1:%d" % port)
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.ui.enabled", "false").config("spark.executor.cores", "2")
                 .config("spark.cores.max", "4").config("spark.executor.memory", "512m")
                 .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"]).getOrCreate())
            ts.wait_executors(s.sparkContext, 2, 90)
            for label in ("kolo.spark.run (first)", "kolo.spark.run (again)"):
                t0 = time.time()
                summarize(label, t0, kolo.spark.run(steps_fn, args=(steps,), num_proc=4, start_timeout=60))
            s.stop()
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    which = sys.argv[2:] or ["kolorun", "ray", "spark"]
    for w in which:
        {"kolorun": bench_kolorun, "ray": bench_ray, "spark": bench_spark}[w](n)
