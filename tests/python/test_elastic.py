"""Elastic training with kolo.torch.elastic through kolorun's elastic mode
(hosts from a discovery script that cats a file the test edits; each host is
an embedded agent on this machine). See docs/elastic.md."""

import os
import re
import threading

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
    t = _once_started(tmp_path, 2, lambda: (tmp_path / "hosts").write_text("hostA:1\n"))
    cmd = [os.path.join(stack, "bin", "kolorun"), "-np", "2", "--min-np", "2",
           "--elastic-timeout", "3", "--max-restarts", "0", "--host-discovery-script", script,
           "--", PYTHON, os.path.join(WORKERS, "elastic_worker.py"), "100000"]
    try:
        res = run_bounded(cmd, 120, env=rank_env({"ELASTIC_STARTED_DIR": str(tmp_path)}),
                          cwd=str(tmp_path))
    finally:
        t.set()
    assert res.rc != 0, res.describe()
    assert "1 rank left, below --min-np 2, for 3 s" in res.out + res.err, res.describe()
