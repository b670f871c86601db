"""Keras fit on every rank with kolo.tensorflow.keras's DistributedOptimizer
and callbacks, against one process fitting the whole batch (computed here
too). Keras 3, or Keras 2 (tf-keras) with TF_USE_LEGACY_KERAS=1.
Prints "CHECK <name> ok" per check (tests/python/test_keras.py)."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kolo.tensorflow.keras as hvd  # noqa: E402

import kolo.keras  # noqa: E402  (horovod.keras' name for the same API)
import kolo.keras.callbacks  # noqa: E402

assert kolo.keras.DistributedOptimizer is hvd.DistributedOptimizer
assert kolo.keras.callbacks.MetricAverageCallback is hvd.callbacks.MetricAverageCallback
tf.get_logger().setLevel("ERROR")
keras = tf.keras
hvd.init()
R, N = hvd.rank(), hvd.size()
KERAS3 = not os.environ.get("TF_USE_LEGACY_KERAS")
if KERAS3:
    import keras as _k  # noqa: E402
else:
    import tf_keras as _k  # noqa: E402
_mod = keras.optimizers.SGD.__module__
assert _mod.startswith("keras" if KERAS3 else "tf_keras"), _mod  # tf.keras is the Keras asked for
print("CHECK keras %s ok" % _k.__version__, flush=True)

B, STEPS = 4, 6
rng = np.random.default_rng(3)
x_all = rng.normal(size=(N * B * STEPS, 5)).astype(np.float32)
y_all = (x_all @ rng.normal(size=(5, 1)) + 0.1).astype(np.float32)
init = [rng.normal(size=(5, 3)).astype(np.float32) * 0.5, np.zeros(3, np.float32),
        rng.normal(size=(3, 1)).astype(np.float32) * 0.5, np.zeros(1, np.float32)]
# Step k of rank r trains on rows [(k*N + r)*B, +B): the whole job's step k
# is the single process's batch k of N*B rows.
idx = np.concatenate([np.arange((k * N + R) * B, (k * N + R + 1) * B) for k in range(STEPS)])


def model():
    m = keras.Sequential([keras.Input(shape=(5,)), keras.layers.Dense(3, activation="tanh"),
                          keras.layers.Dense(1)])
    m.set_weights(init)
    return m


def fit(distributed, opt, callbacks, epochs=2, **kw):
    m = model()
    if distributed:
        opt = hvd.DistributedOptimizer(opt, **kw)
    m.compile(optimizer=opt, loss="mse")
    x, y = (x_all[idx], y_all[idx]) if distributed else (x_all, y_all)
    hist = m.fit(x, y, batch_size=B if distributed else N * B, epochs=epochs, shuffle=False,
                 verbose=0, callbacks=callbacks)
    return m, hist.history


def close(a, b, what, tol=2e-5):
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, rtol=tol, atol=tol, err_msg=what)


def same_on_all_ranks(weights, what):
    flat = np.concatenate([w.ravel() for w in weights])
    gathered = hvd.allgather(tf.constant(flat[None, :])).numpy()
    assert all(np.array_equal(gathered[0], g) for g in gathered), what


# 1. fit with the callbacks == one process on the whole batch
warm = lambda: hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.05, warmup_epochs=2)  # noqa
dm, dh = fit(True, keras.optimizers.SGD(0.05, momentum=0.9),
             [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
              hvd.callbacks.MetricAverageCallback(), warm()])
rm, rh = fit(False, keras.optimizers.SGD(0.05, momentum=0.9), [warm()])
close(dm.get_weights(), rm.get_weights(), "fit with callbacks")
same_on_all_ranks(dm.get_weights(), "fit weights")
lrs = hvd.allgather_object(dh["lr"])
assert lrs[0] == lrs[-1] and abs(dh["lr"][0] - rh["lr"][0]) < 1e-7, (lrs, rh["lr"])
losses = hvd.allgather_object(dh["loss"])
assert all(l == losses[0] for l in losses), losses  # MetricAverageCallback
print("CHECK fit_callbacks ok", flush=True)

# 2. LearningRateScheduleCallback (staircase): epoch 1 runs at lr * 0.5
sched = hvd.callbacks.LearningRateScheduleCallback(
    initial_lr=0.1, multiplier=lambda e: 1.0 if e < 1 else 0.5)
_, h = fit(True, keras.optimizers.SGD(0.1), [sched])
assert abs(h["lr"][0] - 0.1) < 1e-7 and abs(h["lr"][1] - 0.05) < 1e-7, h["lr"]
print("CHECK lr_schedule ok", flush=True)

# 3. backward_passes_per_step (Keras 3): N passes aggregated per update
if KERAS3:
    dm, _ = fit(True, keras.optimizers.SGD(0.05), [], epochs=1, backward_passes_per_step=2,
                average_aggregated_gradients=True)
    rm, _ = fit(False, keras.optimizers.SGD(0.05, gradient_accumulation_steps=2), [], epochs=1)
    close(dm.get_weights(), rm.get_weights(), "backward_passes_per_step")
    print("CHECK backward_passes_per_step ok", flush=True)

# 4. load_model gives back a distributed optimizer
path = os.path.join(sys.argv[1], "model_%d.keras" % R)
dm.save(path)
loaded = hvd.load_model(path)
assert getattr(loaded.optimizer, "_kolo_distributed", False), type(loaded.optimizer)
close(loaded.get_weights(), dm.get_weights(), "load_model", tol=0)
loaded.fit(x_all[idx], y_all[idx], batch_size=B, epochs=1, shuffle=False, verbose=0)
same_on_all_ranks(loaded.get_weights(), "loaded model trains in step")
print("CHECK load_model ok", flush=True)
