"""Horovod's Keras example (examples/tensorflow2/tensorflow2_keras_mnist.py)
on kolo: only the import differs. MNIST-shaped synthetic data (no download).

    kolorun -np 2 python examples/tensorflow2_keras_mnist.py --epochs 2
"""
import argparse

import numpy as np
import tensorflow as tf
import kolo.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps-per-epoch", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

rng = np.random.default_rng(hvd.rank())
n = args.steps_per_epoch * args.batch_size
images = rng.random((n, 28, 28, 1), dtype=np.float32)
labels = rng.integers(0, 10, size=(n,))
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(args.batch_size)

mnist_model = tf.keras.Sequential([
    tf.keras.Input(shape=(28, 28, 1)),
    tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt)

mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                    metrics=["accuracy"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first three epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=min(3, args.epochs),
                                             verbose=1),
]

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0

history = mnist_model.fit(dataset, steps_per_epoch=args.steps_per_epoch // hvd.size(),
                          callbacks=callbacks, epochs=args.epochs, verbose=verbose)
if hvd.rank() == 0:
    print("Done: %d ranks, final loss %.4f" % (hvd.size(), history.history["loss"][-1]))
