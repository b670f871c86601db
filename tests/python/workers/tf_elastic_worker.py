"""Elastic training with kolo.tensorflow.elastic under kolorun
(tests/python/test_tensorflow.py), the TensorFlow twin of elastic_worker.py.

    tf_elastic_worker.py STEPS

A Keras Dense(1, no bias, zeros) on inputs of ones with loss mean(output),
SGD lr 1 through DistributedGradientTape: every step moves each weight by
exactly -1 whatever the world size, so a right state has w == -step. The
state (TensorFlowKerasState: model, optimizer, step) is committed every 5
steps. ELASTIC_CRASH_ONCE=FILE: rank 1 removes FILE and aborts at step 12.
Prints "TF-ELASTIC-OK rank R size S step N resets K sizes A,B,..." (the
sizes hvd.size() gave in each reset callback, "-" for none).
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kolo.tensorflow as hvd  # noqa: E402


def main():
    steps = int(sys.argv[1])
    hvd.init()
    print("started rank %d size %d" % (hvd.rank(), hvd.size()), flush=True)
    if os.environ.get("ELASTIC_STARTED_DIR"):
        open(os.path.join(os.environ["ELASTIC_STARTED_DIR"], "started.%d" % hvd.rank()), "w").close()
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)),
                                 tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    opt = tf.keras.optimizers.SGD(1.0)
    x = tf.ones([1, 4])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    crash = os.environ.get("ELASTIC_CRASH_ONCE")

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            if crash and state.step == 12 and hvd.rank() == 1:
                try:
                    os.unlink(crash)
                except FileNotFoundError:
                    pass
                else:
                    print("crashing at step 12", flush=True)
                    os.abort()
            step()
            state.step += 1
            w = model.get_weights()[0]
            if not np.array_equal(w, np.full_like(w, -float(state.step))):
                raise AssertionError("step %d: w = %s" % (state.step, w.ravel().tolist()))
            if state.step % 5 == 0:
                state.commit()
            time.sleep(0.02)

    train(state)
    w = model.get_weights()[0]
    assert np.array_equal(w, np.full_like(w, -float(steps))), w
    print("TF-ELASTIC-OK rank %d size %d step %d resets %d sizes %s"
          % (hvd.rank(), hvd.size(), state.step, len(resets), ",".join(map(str, resets)) or "-"),
          flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
