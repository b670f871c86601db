"""Issue 45: a stalled collective is never silent. The stall report reaches
the ranks' stderr without --verbose (the agent sends it to the job's ranks),
names the tensor, the missing ranks and their host, comes again every
warning period, and the stall shutdown time ends the job with that text.
Times are lowered by kolorun's flags (Horovod's defaults: 60 s, no shutdown)."""

import os
import socket

from conftest import WORKERS

WARN_S = 1
SHUTDOWN_S = 3


def test_a_name_mismatch_is_reported_on_the_ranks_stderr_and_ends_the_job(kolorun):
    res = kolorun(2, os.path.join(WORKERS, "stall_worker.py"), timeout=60,
                  flags=["--stall-check-warning-time-seconds", str(WARN_S),
                         "--stall-check-shutdown-time-seconds", str(SHUTDOWN_S)])
    host = socket.gethostname()
    for rank, missing, name in ((0, 1, "grad.weight"), (1, 0, "grad.bias")):
        err = res.rank_lines(rank, "stderr")
        reports = [l for l in err if "submitted by only some ranks have waited more than" in l]
        # One at WARN_S, again at 2*WARN_S (periodic), before the shutdown at SHUTDOWN_S.
        assert len(reports) >= 2, res.describe()
        assert any("Missing ranks:" in l for l in err), res.describe()
        assert any(("%d (host %s): [" % (missing, host)) in l and name in l for l in err), \
            res.describe()
        got = [l for l in res.rank_lines(rank) if l.startswith("GOT-ERROR ")]
        assert got, res.describe()
        _, seconds, msg = got[0].split(" ", 2)
        # The job ends at the shutdown time (checked every WARN_S/4), with the report.
        assert SHUTDOWN_S - 0.2 <= float(seconds) <= SHUTDOWN_S + 2, got[0]
        assert "stalled longer than --stall-shutdown-time-s=%d" % SHUTDOWN_S in msg, got[0]
        for who, what in ((1, "grad.weight"), (0, "grad.bias")):
            assert ("rank %d (host %s) has not submitted allreduce.%s" % (who, host, what)) in msg, \
                got[0]
    assert "kolo job " not in res.err, "no hint at the private agent, gone with the job"


def test_an_op_timeout_quotes_the_last_stall_report_instead_of_a_dead_agent(kolorun):
    # No shutdown time (the default): the wait's own timeout ends it, and its
    # message carries the report (kolorun's private agent is gone afterwards,
    # so `kolo job` would be refused).
    res = kolorun(2, os.path.join(WORKERS, "stall_worker.py"), timeout=60,
                  env={"KOLO_OP_TIMEOUT": "3"},
                  flags=["--stall-check-warning-time-seconds", str(WARN_S)])
    # The first rank to give up ends the job for the other ("rank N has shut down").
    got = [l for r in (0, 1) for l in res.rank_lines(r) if l.startswith("GOT-ERROR ")]
    timed_out = [l for l in got if "did not complete within 3.0 s" in l]
    assert timed_out, res.describe()
    _, seconds, msg = timed_out[0].split(" ", 2)
    assert 2.9 <= float(seconds) <= 5, timed_out[0]
    assert "the agent's last stall report:" in msg and "Missing ranks:" in msg, timed_out[0]
    assert "kolo job" not in msg, timed_out[0]
