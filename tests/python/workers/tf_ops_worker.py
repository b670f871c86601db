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


def grad_check(name, dist_fn, ref_fn, shapes, scale=1.0, dtype=np.float64, graph=True):
    """Each input's gradient through the op's registered gradient (eager and
    tf.function) against TensorFlow's autodiff of the reference computed
    here from every rank's inputs: d(sum over ranks r of sum(w_r * y_r))/dx,
    times `scale`, Horovod's factor for the op (1: allreduce, alltoall;
    1/size: allgather and broadcast average the ranks' gradients; size:
    reducescatter). dist_fn(list of x) -> list of y; ref_fn(xs) -> ys with
    xs[r][i], ys[r][j]; shapes(r) -> rank r's input shapes. graph=False:
    eagerly only (a variant of a case that also runs in tf.function)."""
    xs = [[tf.constant(data(r, s, dtype, seed=11 + i)) for i, s in enumerate(shapes(r))]
          for r in range(N)]
    with tf.GradientTape() as tape:
        tape.watch(xs)
        ys = ref_fn(xs)
        ws = [[tf.constant(data(r + 50, y.shape, dtype, seed=12 + j)) for j, y in enumerate(yr)]
              for r, yr in enumerate(ys)]
        loss = tf.add_n([tf.reduce_sum(w * y) for wr, yr in zip(ws, ys) for w, y in zip(wr, yr)])
    want = [g.numpy() * scale for g in
            tape.gradient(loss, xs[R], unconnected_gradients=tf.UnconnectedGradients.ZERO)]

    def dist(*x):
        with tf.GradientTape() as t:
            t.watch(x)
            local = tf.add_n([tf.reduce_sum(w * y) for w, y in zip(ws[R], dist_fn(list(x)))])
        return t.gradient(local, x)

    for got in (run_both(dist, *xs[R]) if graph else [dist(*xs[R])]):
        for i, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-12, atol=1e-12,
                                       err_msg="%s input %d" % (name, i))


def one(fn):
    """A single-tensor collective as grad_check's list form."""
    return lambda xs: [fn(xs[0])]


def per_rank(fn):
    """A reference of single tensors as grad_check's list form."""
    return lambda xs: [[y] for y in fn([x[0] for x in xs])]


def grad_formula(name, dist_fn, formula, shape, graph=True):
    """Horovod's gradient of an allreduce that is not the derivative: the
    same reduction of the incoming gradients (w_r on rank r), computed here
    by `formula` from every rank's w."""
    ws = [data(r + 70, shape, np.float64, seed=13) for r in range(N)]
    x = tf.constant(data(R, shape, np.float64, seed=14))

    def dist(x):
        with tf.GradientTape() as t:
            t.watch(x)
            local = tf.reduce_sum(tf.constant(ws[R]) * dist_fn(x))
        return t.gradient(local, x)

    for got in (run_both(dist, x) if graph else [dist(x)]):
        np.testing.assert_allclose(got.numpy(), formula(ws), rtol=1e-12, atol=1e-12,
                                   err_msg=name)


def check_gradients():
    sp = [[(r + d) % 2 + 1 for d in range(N)] for r in range(N)]
    add = lambda xs: [tf.add_n(xs)] * N  # noqa: E731
    grad_check("allreduce sum", one(lambda x: hvd.allreduce(x, op=hvd.Sum)), per_rank(add),
               lambda r: [(3, 2)])
    grad_check("allreduce average", one(lambda x: hvd.allreduce(x, op=hvd.Average)),
               per_rank(lambda xs: [tf.add_n(xs) / N] * N), lambda r: [(4,)])
    grad_check("allreduce scaled",
               one(lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                           postscale_factor=4.0)),
               per_rank(lambda xs: [tf.add_n([x * 0.5 for x in xs]) * 4.0] * N), lambda r: [(5,)],
               graph=False)
    grad_check("allreduce float32", one(lambda x: hvd.allreduce(x, op=hvd.Sum)), per_rank(add),
               lambda r: [(6,)], dtype=np.float32, graph=False)
    for op, fn in [(hvd.Min, np.minimum.reduce), (hvd.Max, np.maximum.reduce),
                   (hvd.Product, np.multiply.reduce)]:
        grad_formula("allreduce %s" % op, lambda x: hvd.allreduce(x, op=op), fn, (7,),
                     graph=op == hvd.Min)
    grad_check("grouped allreduce sum", lambda xs: hvd.grouped_allreduce(xs, op=hvd.Sum),
               lambda xs: [[tf.add_n([x[i] for x in xs]) for i in range(3)]] * N,
               lambda r: [(4,), (2, 3), ()])
    grad_check("grouped allreduce average scaled",
               lambda xs: hvd.grouped_allreduce(xs, op=hvd.Average, prescale_factor=2.0,
                                                postscale_factor=0.5),
               lambda xs: [[tf.add_n([x[i] * 2.0 for x in xs]) / N * 0.5 for i in range(2)]] * N,
               lambda r: [(3,), (2, 2)])
    grad_check("allgather uneven", one(hvd.allgather),
               per_rank(lambda xs: [tf.concat(xs, 0)] * N), lambda r: [(r + 1, 2)], scale=1.0 / N)
    grad_check("grouped allgather uneven", hvd.grouped_allgather,
               lambda xs: [[tf.concat([x[i] for x in xs], 0) for i in range(2)]] * N,
               lambda r: [(2 * r + 1, 3), (N - r,)], scale=1.0 / N)
    for root in range(N):
        grad_check("broadcast root %d" % root, one(lambda x: hvd.broadcast(x, root)),
                   per_rank(lambda xs: [xs[root]] * N), lambda r: [(3,)], scale=1.0 / N,
                   graph=root == 1)
    grad_check("alltoall splits", one(lambda x: hvd.alltoall(x, splits=sp[R])[0]),
               per_rank(lambda xs: [tf.concat([tf.split(xs[d], sp[d])[r] for d in range(N)], 0)
                                    for r in range(N)]),
               lambda r: [(sum(sp[r]), 2)])
    grad_check("alltoall even", one(lambda x: hvd.alltoall(x)[0]),
               per_rank(lambda xs: [tf.concat([tf.split(xs[d], N)[r] for d in range(N)], 0)
                                    for r in range(N)]),
               lambda r: [(2 * N, 3)], graph=False)
    rows = [len(b) for b in np.array_split(np.arange(2 * N + 1), N)]
    grad_check("reducescatter sum uneven", one(lambda x: hvd.reducescatter(x, op=hvd.Sum)),
               per_rank(lambda xs: tf.split(tf.add_n(xs), rows)), lambda r: [(2 * N + 1, 3)],
               scale=N)
    grad_check("reducescatter average", one(lambda x: hvd.reducescatter(x, op=hvd.Average)),
               per_rank(lambda xs: tf.split(tf.add_n(xs) / N, N)), lambda r: [(2 * N,)], scale=N,
               graph=False)
    grad_check("reducescatter scaled",
               one(lambda x: hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.5,
                                               postscale_factor=4.0)),
               per_rank(lambda xs: tf.split(tf.add_n([x * 0.5 for x in xs]) * 4.0, N)),
               lambda r: [(N, 2)], scale=N, graph=False)
    grad_check("grouped reducescatter", lambda xs: hvd.grouped_reducescatter(xs, op=hvd.Sum),
               lambda xs: [list(p) for p in zip(*[tf.split(tf.add_n([x[i] for x in xs]), N)
                                                  for i in range(2)])],
               lambda r: [(N, 2), (2 * N,)], scale=N)
    ok("gradients")


def rounded(x, dt):
    """float64 -> dt as TensorFlow casts it (through float32 for 16 bits)."""
    return x.astype(dt) if dt is np.float64 else x.astype(np.float32).astype(dt)


def ada_pair(a, b):
    """Horovod's Adasum of two flat vectors, written out: the dot product and
    the norms in float64, the result rounded to their dtype."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    dot, na, nb = float(np.dot(a64, b64)), float(np.dot(a64, a64)), float(np.dot(b64, b64))
    ca = 1.0 - dot / na * 0.5 if na >= 1e-8 else 1.0
    cb = 1.0 - dot / nb * 0.5 if nb >= 1e-8 else 1.0
    return rounded(ca * a64 + cb * b64, a.dtype.type)


def ada_ref(vs):
    """Horovod's tree over the ranks' tensors: the first power-of-two block
    of ranks against the rest, recursively."""
    if len(vs) == 1:
        return vs[0]
    p = 1
    while p * 2 < len(vs):
        p *= 2
    flat = ada_pair(ada_ref([v.ravel() for v in vs[:p]]).ravel(),
                    ada_ref([v.ravel() for v in vs[p:]]).ravel())
    return flat.reshape(vs[0].shape)


def ada_same(got, want, dt, what, exact):
    """Bit-exact where the float64 dot products are exact in any order (2
    ranks of k/8 data; 16-bit dtypes); otherwise within 4 ulps of dt of the
    largest value (at 4 ranks the second level's float32/float64 dot
    products round differently in numpy's and TensorFlow's summation order)."""
    if exact or dt in (np.float16, ml_dtypes.bfloat16):
        return same(got, want, what)
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got, want)
    err = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0)
    tol = 4 * np.finfo(dt).eps * max(np.max(np.abs(want.astype(np.float64)), initial=0.0), 1.0)
    assert err <= tol, "%s: error %g > %g: got %r, want %r" % (what, err, tol, got, want)


def check_adasum():
    exact = N == 2
    for dt in FLOATS:
        for shape in [(5,), (17, 3)]:
            xs = [data(r, shape, dt, seed=20 + len(shape)) for r in range(N)]
            want = ada_ref(xs)
            fn = lambda x: hvd.allreduce(x, op=hvd.Adasum)  # noqa: E731
            both = dt is np.float32 and len(shape) == 2  # the graph path once
            for got in (run_both(fn, tf.constant(xs[R])) if both else [fn(tf.constant(xs[R]))]):
                ada_same(got.numpy(), want, dt, "adasum %s %s" % (np.dtype(dt), shape), exact)
        # prescale 0.5 and postscale 4 (exact in every dtype) around the tree
        xs = [data(r, (9,), dt, seed=23) for r in range(N)]
        want = rounded(ada_ref([rounded(x.astype(np.float64) * 0.5, dt) for x in xs])
                       .astype(np.float64) * 4.0, dt)
        got = hvd.allreduce(tf.constant(xs[R]), op=hvd.Adasum, prescale_factor=0.5,
                            postscale_factor=4.0)
        ada_same(got.numpy(), want, dt, "adasum scaled %s" % np.dtype(dt), exact)
    # grouped: each tensor its own coefficients; fp16 compression
    xs = [[data(r, (6,), np.float64, seed=24), data(r, (2, 3), np.float32, seed=25)]
          for r in range(N)]
    for got in run_both(lambda *t: hvd.grouped_allreduce(list(t), op=hvd.Adasum),
                        *[tf.constant(x) for x in xs[R]]):
        for i in range(2):
            ada_same(got[i].numpy(), ada_ref([x[i] for x in xs]), xs[0][i].dtype.type,
                     "grouped adasum %d" % i, exact)
    xs = [data(r, (8,), np.float32, seed=26) for r in range(N)]
    got = hvd.allreduce(tf.constant(xs[R]), op=hvd.Adasum, compression=hvd.Compression.fp16)
    same(got.numpy(), ada_ref([x.astype(np.float16) for x in xs]).astype(np.float32),
         "adasum fp16 compression")
    # exact cases: gradients with disjoint support add, equal ones stay
    x = np.zeros(4 * N)
    x[4 * R:4 * R + 4] = np.arange(1, 5) * (R + 1)
    same(hvd.allreduce(tf.constant(x), op=hvd.Adasum).numpy(),
         np.concatenate([np.arange(1, 5.0) * (r + 1) for r in range(N)]), "adasum orthogonal")
    v = np.linspace(-2, 3, 10)
    same(hvd.allreduce(tf.constant(v), op=hvd.Adasum).numpy(), v, "adasum equal")
    # Horovod's gradient: the Adasum allreduce of the incoming gradients
    grad_formula("adasum gradient", lambda x: hvd.allreduce(x, op=hvd.Adasum), ada_ref, (6,))
    check_adasum_tape()
    check_adasum_errors()
    ok("adasum")


def check_adasum_tape():
    """DistributedGradientTape(op=Adasum): every gradient is the Adasum of the
    ranks' local gradients (eagerly one grouped gather, in a graph one per
    gradient)."""
    rng = np.random.default_rng(31)
    xs, ys = rng.normal(size=(N, 6, 3)), rng.normal(size=(N, 6, 1))
    w, b = tf.Variable(rng.normal(size=(3, 1))), tf.Variable(np.zeros(1))

    def local_grads(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)
        return tape, loss

    want = []
    for r in range(N):
        tape, loss = local_grads(xs[r], ys[r])
        want.append([g.numpy() for g in tape.gradient(loss, [w, b])])
    want = [ada_ref([want[r][i] for r in range(N)]) for i in range(2)]

    def dist():
        tape, loss = local_grads(xs[R], ys[R])
        return hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [w, b])

    for got in (dist(), tf.function(dist)()):
        for g, wnt in zip(got, want):
            np.testing.assert_allclose(g.numpy(), wnt, rtol=1e-12, atol=1e-14,
                                       err_msg="adasum tape")


def expect_error(kind, text, fn):
    try:
        fn()
    except kind as e:
        assert text in str(e), (text, str(e))
        return
    raise AssertionError("no %s (%s)" % (kind.__name__, text))


def check_adasum_errors():
    expect_error(ValueError, "Adasum combines floating point tensors only",
                 lambda: hvd.allreduce(tf.constant([1, 2]), op=hvd.Adasum))
    sparse = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))
    expect_error(NotImplementedError, "Adasum does not support sparse tensors",
                 lambda: hvd.allreduce(sparse, op=hvd.Adasum))
    expect_error(NotImplementedError, "Adasum is not supported here",
                 lambda: hvd.reducescatter(tf.ones([N]), op=hvd.Adasum))
    import kolo.tensorflow.keras as khvd
    expect_error(ValueError, "op == Adasum is not supported yet with Keras",
                 lambda: khvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), op=hvd.Adasum))


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
check_adasum()
check_tape_training(False)
check_tape_training(True)
check_errors()
check_process_set()
hvd.barrier()
last = hvd.join()
assert 0 <= last < N, last
ok("join")
sys.stdout.flush()
