"""Elastic training under kolorun (tests/python/test_elastic.py).

    elastic_worker.py STEPS

A linear model w (4 weights, zeros) trained with SGD lr 1 on loss = w . ones:
every rank's gradient is ones, so each applied step moves w by exactly -1
whatever the world size, and a state that is right has w == -step. The
loop commits every 5 steps. ELASTIC_CRASH_ONCE=FILE: rank 1 removes FILE
and aborts at step 20 (a crash its restart does not repeat). At the end it
checks w == -STEPS (no step lost or applied twice) and prints
"ELASTIC-OK rank R size S step N resets K". Each reset callback prints
"RESET rank R size S" with hvd.size() as the callback sees it (and appends
S to ELASTIC_STARTED_DIR/resets.PID). ELASTIC_STOP_FILE=FILE: the job
stops at the first commit after FILE exists on any rank (the steps done
so far must then be right).
"""

import os
import sys
import time

import torch

import kolo.torch as hvd


def main():
    steps = int(sys.argv[1])
    hvd.init()
    print("started rank %d size %d" % (hvd.rank(), hvd.size()), flush=True)
    if os.environ.get("ELASTIC_STARTED_DIR"):  # tells the test the job formed
        open(os.path.join(os.environ["ELASTIC_STARTED_DIR"], "started.%d" % hvd.rank()), "w").close()
    model = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    resets = []

    def on_reset():
        resets.append(hvd.size())
        print("RESET rank %d size %d" % (hvd.rank(), hvd.size()), flush=True)
        if os.environ.get("ELASTIC_STARTED_DIR"):
            with open(os.path.join(os.environ["ELASTIC_STARTED_DIR"], "resets.%d" % os.getpid()), "a") as f:
                f.write("%d\n" % hvd.size())

    state.register_reset_callbacks([on_reset])
    crash = os.environ.get("ELASTIC_CRASH_ONCE")
    stop_file = os.environ.get("ELASTIC_STOP_FILE")

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            if crash and state.step == 20 and hvd.rank() == 1:
                try:
                    os.unlink(crash)
                except FileNotFoundError:
                    pass
                else:
                    print("crashing at step 20", flush=True)
                    os.abort()
            opt.zero_grad()
            model(torch.ones(1, 4)).sum().backward()
            opt.step()
            state.step += 1
            want = torch.full_like(model.weight, -float(state.step))
            if not torch.equal(model.weight.data, want):
                raise AssertionError("step %d: w = %s" % (state.step, model.weight.data.tolist()))
            if state.step % 5 == 0:
                state.commit()
                if stop_file:
                    flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
                    if hvd.allreduce(flag, op=hvd.Sum, name="stop").item() > 0:
                        return
            time.sleep(0.02)

    train(state)
    want = steps if not stop_file else state.step
    assert torch.equal(model.weight.data, torch.full_like(model.weight, -float(want))), model.weight
    print("ELASTIC-OK rank %d size %d step %d resets %d" % (hvd.rank(), hvd.size(), state.step,
                                                           len(resets)), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
