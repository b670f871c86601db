"""Functions that test_ray.py and test_spark.py run on every rank through
kolo.ray.RayExecutor and kolo.spark.run. They use kolo.torch as a Horovod
script uses horovod.torch."""

import os
import signal
import time

import torch
import torch.nn.functional as F

import common_model as cm


def train_and_allreduce():
    """A kolo.torch training run (common_model, config 'plain') and one
    exact allreduce; returns what the test checks against its reference."""
    import kolo.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    t = torch.arange(8, dtype=torch.float64) * (rank + 1)
    summed = hvd.allreduce(t, op=hvd.Sum, name="cluster.sum")
    gathered = hvd.allgather(torch.tensor([rank], dtype=torch.int64), name="cluster.gather")
    model = cm.make_model(cm.INIT_SEED + rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = cm.make_optimizer({}, model.parameters(), size)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for step in range(cm.STEPS):
        opt.zero_grad()
        x, y = cm.local_batch(step, 0, size, rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    out = {"rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
           "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
           "sum": summed.tolist(), "gathered": gathered.tolist(),
           "params": cm.flat_params(model).tolist(), "pid": os.getpid(),
           "socket": os.environ["KOLO_AGENT_SOCKET"]}
    hvd.barrier()
    return out


def fail_on(bad_rank):
    """Rank bad_rank raises after the first allreduce; the others go on to a
    second allreduce that can never complete."""
    import kolo.torch as hvd
    t0 = time.monotonic()
    hvd.init()
    t1 = time.monotonic()
    hvd.allreduce(torch.ones(4), name="fail.first")
    if hvd.rank() == bad_rank:
        raise ValueError("rank %d says boom on purpose (init %.1f s, allreduce %.1f s)"
                         % (bad_rank, t1 - t0, time.monotonic() - t1))
    hvd.allreduce(torch.ones(4), name="fail.second")
    return hvd.rank()


def die_on(victim):
    """Rank victim's process is SIGKILLed after the first allreduce."""
    import kolo.torch as hvd
    hvd.init()
    hvd.allreduce(torch.ones(4), name="die.first")
    if hvd.rank() == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(torch.ones(4), name="die.second")
    return hvd.rank()


def _spark_executor_pid():
    pid = os.getpid()
    while pid > 1:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if b"CoarseGrainedExecutorBackend" in f.read():
                    return pid
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return None
    return None


def kill_executor_on(victim):
    """Rank victim SIGKILLs the Spark executor JVM that runs it."""
    import kolo.torch as hvd
    hvd.init()
    hvd.allreduce(torch.ones(4), name="kill.first")
    if hvd.rank() == victim:
        os.kill(_spark_executor_pid(), signal.SIGKILL)
        time.sleep(60)
    hvd.allreduce(torch.ones(4), name="kill.second")
    return hvd.rank()


def elastic_train(progress_dir, max_steps=100000):
    """kolo.torch.elastic training for ElasticRayExecutor (test_ray_elastic.py).

    A linear model w (4 weights, zeros), SGD lr 1 on loss = w . ones: every
    rank's gradient is ones, so each applied step moves w by exactly -1
    whatever the world size, and a right state has w == -step (checked at
    every step: a lost or doubled step fails the rank). Commits every 5
    steps; stops at the first commit after progress_dir/stop exists on any
    rank. Writes progress_dir/started.PID once it trained a step, the size of
    the world it trains in to progress_dir/world.PID after each commit, and
    appends hvd.size() to progress_dir/resets.PID in each reset callback."""
    import kolo.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    model = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    sizes = []
    stop = os.path.join(progress_dir, "stop")

    def on_reset():
        sizes.append(hvd.size())
        with open(os.path.join(progress_dir, "resets.%d" % os.getpid()), "a") as f:
            f.write("%d\n" % hvd.size())

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.step < max_steps:
            opt.zero_grad()
            model(torch.ones(1, 4)).sum().backward()
            opt.step()
            state.step += 1
            if not torch.equal(model.weight.data, torch.full_like(model.weight, -float(state.step))):
                raise AssertionError("step %d: w = %s" % (state.step, model.weight.data.tolist()))
            if state.step == 1:
                open(os.path.join(progress_dir, "started.%d" % os.getpid()), "w").close()
            if state.step % 5 == 0:
                state.commit()
                world = os.path.join(progress_dir, "world.%d" % os.getpid())
                with open(world + ".tmp", "w") as f:
                    f.write("%d\n" % hvd.size())
                os.replace(world + ".tmp", world)
                flag = torch.tensor([1.0 if os.path.exists(stop) else 0.0])
                if hvd.allreduce(flag, op=hvd.Sum, name="stop").item() > 0:
                    return
            time.sleep(0.02)

    train(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "pid": os.getpid(),
            "w": model.weight.data.flatten().tolist(), "resets": sizes}


def allreduce_until(marker_dir, seconds):
    """Allreduces for `seconds` (a job a test kills a worker of); writes
    marker_dir/started.RANK after the first one."""
    import kolo.torch as hvd
    hvd.init()
    hvd.allreduce(torch.ones(4), name="until.first")
    open(os.path.join(marker_dir, "started.%d" % hvd.rank()), "w").close()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hvd.allreduce(torch.ones(4), name="until.step")
        time.sleep(0.01)
    return hvd.rank()
