"""Elastic training with kolo.torch.elastic through kolorun's elastic mode
(hosts from a discovery script that cats a file the test edits; each host is
an embedded agent on this machine). See docs/elastic.md."""

import os
import re
import threading
import time

from conftest import PYTHON, WORKERS, rank_env, run_bounded


def _setup(tmp_path, hosts):
    (tmp_path / "hosts").write_text(hosts)
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % (tmp_path / "hosts"))
    script.chmod(0o755)
    return str(script)


def _once_started(tmp_path, ranks, fn):
    """Calls fn one second after `ranks` ranks wrote their started marker
    (ELASTIC_STARTED_DIR): the job has formed and is training."""
    stop = threading.Event()

    def wait():
        while not stop.is_set():
            if len(list(tmp_path.glob("started.*"))) >= ranks:
                if not stop.wait(1.0):
                    fn()
                return
            stop.wait(0.05)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    return stop


def test_hosts_come_and_go_and_a_crashed_rank_restarts(stack, tmp_path):
    script = _setup(tmp_path, "hostA:1\nhostB:1\nhostC:1\n")
    crash = tmp_path / "crash-once"
    crash.write_text("x")
    t = _once_started(tmp_path, 3, lambda: (tmp_path / "hosts").write_text("hostA:1\nhostB:1\nhostD:1\n"))
    cmd = [os.path.join(stack, "bin", "kolorun"), "-np", "3", "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", script, "--", PYTHON,
           os.path.join(WORKERS, "elastic_worker.py"), "200"]
    try:
        res = run_bounded(cmd, 240, env=rank_env({"ELASTIC_CRASH_ONCE": str(crash),
                                                  "ELASTIC_STARTED_DIR": str(tmp_path)}),
                          cwd=str(tmp_path))
    finally:
        t.set()
    text = res.out + res.err
    assert res.rc == 0, res.describe()
    assert "crashing at step 20" in text, res.describe()
    assert "restarting it (restart 1 of 3)" in text, res.describe()
    assert "host hostC is gone" in text, res.describe()
    assert "host hostD discovered" in text, res.describe()
    done = set(re.findall(r"ELASTIC-OK rank (\d+) size 3 step 200", text))
    assert done == {"0", "1", "2"}, res.describe()


def test_below_min_np_fails_after_the_elastic_timeout(stack, tmp_path):
    script = _setup(tmp_path, "hostA:1\nhostB:1\n")
    removed = []
    t = _once_started(tmp_path, 2, lambda: (removed.append(time.monotonic()),
                                            (tmp_path / "hosts").write_text("hostA:1\n")))
    cmd = [os.path.join(stack, "bin", "kolorun"), "-np", "2", "--min-np", "2",
           "--elastic-timeout", "3", "--host-discovery-script", script,
           "--", PYTHON, os.path.join(WORKERS, "elastic_worker.py"), "100000"]
    try:
        res = run_bounded(cmd, 120, env=rank_env({"ELASTIC_STARTED_DIR": str(tmp_path)}),
                          cwd=str(tmp_path))
    finally:
        t.set()
    assert res.rc != 0, res.describe()
    text = res.out + res.err
    assert "1 rank left, below --min-np 2, for 3 s" in text, res.describe()
    # The default --max-restarts (3): nothing is restarted into the FAILED job.
    assert "below --min-np 2, so it failed (or cannot go on): not restarting it" in text, res.describe()
    assert "restarting it (restart" not in text, res.describe()
    took = time.monotonic() - removed[0]
    assert 3.0 <= took < 40.0, (took, res.describe())


def _resets(tmp_path):
    sizes = []
    for f in tmp_path.glob("resets.*"):
        sizes.append([int(x) for x in f.read_text().split()])
    return sizes


def test_reset_callbacks_see_the_new_size_on_grow_and_on_shrink(stack, tmp_path):
    """Horovod's order: the new world is known before State.on_reset(), so
    hvd.size() in a reset callback is the size after the change (2 -> 3 on
    grow, 3 -> 2 on shrink), the learning-rate scaling idiom's premise."""
    script = _setup(tmp_path, "hostA:1\nhostB:1\n")
    stop = tmp_path / "stop"
    done = threading.Event()

    def drive():
        deadline = time.monotonic() + 150
        step = 0  # 0: wait for the job, 1: grown, 2: shrunk
        while not done.is_set() and time.monotonic() < deadline:
            seen = [s for per in _resets(tmp_path) for s in per]
            if step == 0 and len(list(tmp_path.glob("started.*"))) >= 2:
                (tmp_path / "hosts").write_text("hostA:1\nhostB:1\nhostC:1\n")
                step = 1
            elif step == 1 and 3 in seen and len(list(tmp_path.glob("started.*"))) >= 3:
                (tmp_path / "hosts").write_text("hostA:1\nhostB:1\n")
                step = 2
            elif step == 2 and any(per and per[-1] == 2 and 3 in per for per in _resets(tmp_path)):
                stop.write_text("x")
                return
            done.wait(0.1)

    t = threading.Thread(target=drive, daemon=True)
    t.start()
    cmd = [os.path.join(stack, "bin", "kolorun"), "-np", "2", "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", script, "--", PYTHON,
           os.path.join(WORKERS, "elastic_worker.py"), "1000000"]
    try:
        res = run_bounded(cmd, 180, env=rank_env({"ELASTIC_STARTED_DIR": str(tmp_path),
                                                  "ELASTIC_STOP_FILE": str(stop)}),
                          cwd=str(tmp_path))
    finally:
        done.set()
    text = res.out + res.err
    assert res.rc == 0, res.describe()
    assert "host hostC discovered" in text and "host hostC is gone" in text, res.describe()
    # The ranks of hostA and hostB (ids 0 and 1) saw the grow, then the shrink.
    for rid in ("0", "1"):
        sizes = [int(s) for s in re.findall(r"\[%s\]<stdout>:RESET rank \d+ size (\d+)" % rid, text)]
        assert sizes and sizes[0] == 3 and sizes[-1] == 2, (rid, sizes, res.describe())
        assert re.search(r"\[%s\]<stdout>:ELASTIC-OK rank \d+ size 2 step \d+" % rid, text), res.describe()
