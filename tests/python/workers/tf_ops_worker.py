"""kolo.tensorflow's collectives on every rank, each against a reference
computed here with numpy / plain TensorFlow (tests/python/test_tensorflow.py).
Prints "CHECK <name> ok" per check; any mismatch raises (non-zero exit)."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import ml_dtypes  # noqa: E402  (comes with TensorFlow: numpy's bfloat16)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kolo.tensorflow as hvd  # noqa: E402

tf.get_logger().setLevel("ERROR")  # retracing warnings: each check traces anew
hvd.init()
R, N = hvd.rank(), hvd.size()
FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
INTS = [np.int32, np.int64, np.uint8, np.int8]


def data(rank, shape, dt, seed=0, product=False):
    """Values k/8 (k small): exact in every dtype, so sums and scalings by 2
    round the same everywhere; for products, powers of two (+-1/2, 1, 2),
    whose products over any number of ranks are exact and fit int8."""
    rng = np.random.default_rng(1000 * seed + rank)
    if product:
        vals = np.array([1, 2] if dt is np.uint8 else [-2, -1, 1, 2] if dt in INTS
                        else [-2, -1, -0.5, 0.5, 1, 2])
        return vals[rng.integers(0, len(vals), size=shape)].astype(np.float32).astype(dt)
    if dt in (np.uint8,):
        return rng.integers(0, 12, size=shape).astype(dt)
    if dt in INTS:
        return rng.integers(-10, 11, size=shape).astype(dt)
    if dt is bool:
        return rng.integers(0, 2, size=shape).astype(bool)
    return (rng.integers(-32, 33, size=shape) / 8.0).astype(np.float32).astype(dt)


def same(got, want, what):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape or \
            got.tobytes() != want.tobytes():
        raise AssertionError("%s: got %r (%s %s), want %r (%s %s)" % (
            what, got, got.dtype, got.shape, want, want.dtype, want.shape))


def ok(name):
    print("CHECK %s ok" % name, flush=True)


def reduce_ref(xs, op, dt):
    wide = [x.astype(np.float64) for x in xs]
    if op == hvd.Sum:
        out = sum(wide)
    elif op == hvd.Average:
        out = sum(wide) / len(xs)
    elif op == hvd.Min:
        out = np.minimum.reduce(wide)
    elif op == hvd.Max:
        out = np.maximum.reduce(wide)
    else:
        out = np.multiply.reduce(wide)
    return out.astype(np.float32).astype(dt) if dt in FLOATS else out.astype(dt)


def run_both(fn, *args):
    """fn eagerly and inside tf.function."""
    return fn(*args), tf.function(fn)(*args)


def check_allreduce():
    for dt in FLOATS + INTS:
        ops = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product] + ([hvd.Average] if dt in FLOATS else [])
        for shape in [(), (7,), (3, 4)]:
            for op in ops:
                xs = [data(r, shape, dt, seed=op, product=op == hvd.Product) for r in range(N)]
                want = reduce_ref(xs, op, dt)
                for got in run_both(lambda x: hvd.allreduce(x, op=op), tf.constant(xs[R])):
                    same(got.numpy(), want, "allreduce %s %s %s" % (np.dtype(dt), shape, op))
        if dt in FLOATS:  # prescale 0.5, postscale 4 (exact)
            xs = [data(r, (5,), dt, seed=9) for r in range(N)]
            want = (sum(x.astype(np.float64) for x in xs) * 2).astype(np.float32).astype(dt)
            for got in run_both(lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                                        postscale_factor=4.0),
                                tf.constant(xs[R])):
                same(got.numpy(), want, "allreduce scaled %s" % np.dtype(dt))
    # fp16 compression: float32 in, float32 out, values exact in float16
    xs = [data(r, (6,), np.float32, seed=3) for r in range(N)]
    got = hvd.allreduce(tf.constant(xs[R]), op=hvd.Sum, compression=hvd.Compression.fp16)
    same(got.numpy(), sum(xs).astype(np.float32), "allreduce fp16 compression")
    ok("allreduce")


def check_grouped_allreduce():
    dts = [np.float32, np.float64, np.int32, np.float16]
    xs = [[data(r, (i + 2,), dt, seed=i) for i, dt in enumerate(dts)] for r in range(N)]
    want = [reduce_ref([xs[r][i] for r in range(N)], hvd.Sum, dt) for i, dt in enumerate(dts)]
    for got in run_both(lambda *t: hvd.grouped_allreduce(list(t), op=hvd.Sum),
                        *[tf.constant(x) for x in xs[R]]):
        for g, w in zip(got, want):
            same(g.numpy(), w, "grouped_allreduce")
    ok("grouped_allreduce")


def check_allgather():
    for dt in FLOATS + INTS + [bool]:
        xs = [data(r, (r + 1, 3), dt) for r in range(N)]  # first dims differ
        want = np.concatenate(xs)
        for got in run_both(hvd.allgather, tf.constant(xs[R])):
            same(got.numpy(), want, "allgather %s" % np.dtype(dt))
    xs = [[data(r, (2 * r, 2), np.float32), data(r, (1,), np.int64)] for r in range(N)]
    got = hvd.grouped_allgather([tf.constant(x) for x in xs[R]])
    same(got[0].numpy(), np.concatenate([x[0] for x in xs]), "grouped_allgather 0")
    same(got[1].numpy(), np.concatenate([x[1] for x in xs]), "grouped_allgather 1")
    ok("allgather")


def check_broadcast():
    for dt in FLOATS + INTS + [bool]:
        for root in range(N):
            xs = [data(r, (4, 2), dt, seed=root) for r in range(N)]
            for got in run_both(lambda x: hvd.broadcast(x, root), tf.constant(xs[R])):
                same(got.numpy(), xs[root], "broadcast %s root %d" % (np.dtype(dt), root))
    v = tf.Variable(data(R, (3,), np.float32))
    hvd.broadcast_variables([v], root_rank=1)
    same(v.numpy(), data(1, (3,), np.float32), "broadcast_variables")
    assert hvd.broadcast_object({"r": R}, root_rank=1) == {"r": 1}
    assert hvd.allgather_object(("a", R)) == [("a", r) for r in range(N)]
    ok("broadcast")


def check_alltoall():
    splits = [[(r + d) % 3 + 1 for d in range(N)] for r in range(N)]
    for dt in [np.float32, ml_dtypes.bfloat16, np.int64, np.uint8, bool]:
        xs = [data(r, (sum(splits[r]), 2), dt) for r in range(N)]
        parts = [np.split(xs[r], np.cumsum(splits[r])[:-1]) for r in range(N)]
        want = np.concatenate([parts[d][R] for d in range(N)])
        want_splits = np.array([splits[d][R] for d in range(N)], np.int32)
        for got, rs in run_both(lambda x: hvd.alltoall(x, splits=splits[R]), tf.constant(xs[R])):
            same(got.numpy(), want, "alltoall %s" % np.dtype(dt))
            same(rs.numpy(), want_splits, "alltoall received splits")
    xs = [data(r, (2 * N,), np.float32) for r in range(N)]
    got, rs = hvd.alltoall(tf.constant(xs[R]))  # even
    same(got.numpy(), np.concatenate([xs[d][2 * R:2 * R + 2] for d in range(N)]), "alltoall even")
    ok("alltoall")


def check_reducescatter():
    for dt in [np.float32, np.float64, np.float16, np.int32]:
        for op in ([hvd.Sum, hvd.Average] if dt != np.int32 else [hvd.Sum]):
            xs = [data(r, (2 * N + 1, 3), dt, seed=op) for r in range(N)]
            full = reduce_ref(xs, op, dt)
            rows = [len(b) for b in np.array_split(np.arange(2 * N + 1), N)]
            start = sum(rows[:R])
            want = full[start:start + rows[R]]
            for got in run_both(lambda x: hvd.reducescatter(x, op=op), tf.constant(xs[R])):
                same(got.numpy(), want, "reducescatter %s %s" % (np.dtype(dt), op))
    xs = [[data(r, (N, 2), np.float32), data(r, (2 * N,), np.float64)] for r in range(N)]
    got = hvd.grouped_reducescatter([tf.constant(x) for x in xs[R]], op=hvd.Sum)
    for i in range(2):
        full = reduce_ref([x[i] for x in xs], hvd.Sum, xs[0][i].dtype.type)
        k = full.shape[0] // N
        same(got[i].numpy(), full[R * k:(R + 1) * k], "grouped_reducescatter %d" % i)
    ok("reducescatter")


def grad_check(name, dist_fn, ref_fn, shape):
    """d(sum over ranks of sum(w_r * y_r))/dx_me through the op's registered
    gradient (eager and tf.function) against TensorFlow's autodiff of the
    reference computed here from every rank's input."""
    xs = [tf.constant(data(r, shape(r), np.float64, seed=11)) for r in range(N)]
    ws = None

    def weights(ys):
        return [tf.constant(data(r + 50, ys[r].shape, np.float64, seed=12)) for r in range(N)]

    with tf.GradientTape() as tape:
        tape.watch(xs)
        ys = ref_fn(xs)
        ws = weights(ys)
        loss = tf.add_n([tf.reduce_sum(w * y) for w, y in zip(ws, ys)])
    want = tape.gradient(loss, xs[R], unconnected_gradients=tf.UnconnectedGradients.ZERO).numpy()

    def dist(x):
        with tf.GradientTape() as t:
            t.watch(x)
            y = dist_fn(x)
            local = tf.reduce_sum(ws[R] * y)
        return t.gradient(local, x)

    for got in run_both(dist, xs[R]):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12, err_msg=name)


def check_gradients():
    sp = [[(r + d) % 2 + 1 for d in range(N)] for r in range(N)]
    grad_check("allreduce sum", lambda x: hvd.allreduce(x, op=hvd.Sum),
               lambda xs: [tf.add_n(xs)] * N, lambda r: (3, 2))
    grad_check("allreduce average", lambda x: hvd.allreduce(x, op=hvd.Average),
               lambda xs: [tf.add_n(xs) / N] * N, lambda r: (4,))
    grad_check("grouped allreduce", lambda x: hvd.grouped_allreduce([x], op=hvd.Sum)[0],
               lambda xs: [tf.add_n(xs)] * N, lambda r: (4,))
    grad_check("allgather", hvd.allgather, lambda xs: [tf.concat(xs, 0)] * N,
               lambda r: (r + 1, 2))
    grad_check("broadcast", lambda x: hvd.broadcast(x, 1), lambda xs: [xs[1]] * N,
               lambda r: (3,))
    grad_check("alltoall", lambda x: hvd.alltoall(x, splits=sp[R])[0],
               lambda xs: [tf.concat([tf.split(xs[d], sp[d])[r] for d in range(N)], 0)
                           for r in range(N)],
               lambda r: (sum(sp[r]), 2))
    grad_check("reducescatter", lambda x: hvd.reducescatter(x, op=hvd.Sum),
               lambda xs: tf.split(tf.add_n(xs), N), lambda r: (2 * N, 3))
    grad_check("reducescatter average", lambda x: hvd.reducescatter(x, op=hvd.Average),
               lambda xs: tf.split(tf.add_n(xs) / N, N), lambda r: (2 * N,))
    ok("gradients")


def check_tape_training(sparse_as_dense):
    """Linear model + embedding (IndexedSlices gradients), SGD: 2 ranks on
    half batches each equal one process on the whole batch."""
    rng = np.random.default_rng(5)
    x_all = rng.normal(size=(8 * N, 4))
    ids_all = rng.integers(0, 6, size=(8 * N,))
    y_all = rng.normal(size=(8 * N, 1))
    w0, e0 = rng.normal(size=(4, 1)), rng.normal(size=(6, 1))

    def train(x, ids, y, distributed):
        w, e = tf.Variable(w0), tf.Variable(e0)
        opt = tf.keras.optimizers.SGD(0.1)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                pred = tf.matmul(x, w) + tf.gather(e, ids)
                loss = tf.reduce_mean((pred - y) ** 2)
            if distributed:
                tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
                assert isinstance(tape, tf.GradientTape)
            grads = tape.gradient(loss, [w, e])
            assert isinstance(grads[1], tf.IndexedSlices) != sparse_as_dense or not distributed
            opt.apply_gradients(zip(grads, [w, e]))
        for _ in range(5):
            step()
        return w.numpy(), e.numpy()

    lo, hi = 8 * R, 8 * (R + 1)
    wd, ed = train(x_all[lo:hi], ids_all[lo:hi], y_all[lo:hi], True)
    wr, er = train(x_all, ids_all, y_all, False)
    np.testing.assert_allclose(wd, wr, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ed, er, rtol=1e-9, atol=1e-12)
    gathered = hvd.allgather(tf.constant(np.concatenate([wd, ed]).T)).numpy()
    assert all(np.array_equal(gathered[0], g) for g in gathered), gathered
    ok("tape_training sparse_as_dense=%s" % sparse_as_dense)


def check_errors():
    try:
        hvd.allreduce(tf.ones([2 + R]), name="mismatched_tensor")
        raise AssertionError("a shape mismatch across ranks did not fail")
    except tf.errors.InvalidArgumentError as e:
        msg = str(e)
        assert "mismatched_tensor" in msg and "Mismatched allreduce tensor shapes" in msg, msg
    try:
        hvd.allgather(tf.ones([2], tf.float32 if R == 0 else tf.float64), name="dtype_mix")
        raise AssertionError("a dtype mismatch across ranks did not fail")
    except tf.errors.OpError as e:
        assert "dtype_mix" in str(e) and "ismatched" in str(e), str(e)
    try:
        hvd.allreduce(tf.ones([2]), process_set=hvd.ProcessSet([0]))
        raise AssertionError("an unregistered process set did not fail")
    except ValueError as e:
        assert "is not registered" in str(e), str(e)

    @tf.function(jit_compile=True)
    def jitted(x):
        return hvd.allreduce(x)
    try:
        jitted(tf.ones([2]))
        raise AssertionError("jit_compile did not fail")
    except tf.errors.InvalidArgumentError as e:
        assert "unsupported operations" in str(e) and "KoloAllreduce" in str(e), str(e)
    # the job goes on after the errors
    same(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy(), np.full([2], N, np.float32), "after")
    ok("errors")


def check_process_set():
    ps = hvd.add_process_set([N - 1])
    if R == N - 1:
        same(hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum, process_set=ps).numpy(),
             np.array([1.0, 2.0], np.float32), "process set allreduce")
    hvd.remove_process_set(ps)
    ok("process_set")


check_allreduce()
check_grouped_allreduce()
check_allgather()
check_broadcast()
check_alltoall()
check_reducescatter()
check_gradients()
check_tape_training(False)
check_tape_training(True)
check_errors()
check_process_set()
hvd.barrier()
last = hvd.join()
assert 0 <= last < N, last
ok("join")
sys.stdout.flush()
