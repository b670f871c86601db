"""Horovod's TF2 custom training loop (examples/tensorflow2/tensorflow2_mnist.py)
on kolo: only the import differs. MNIST-shaped synthetic data (no download).

    kolorun -np 2 python examples/tensorflow2_mnist.py --steps 20
"""
import argparse

import numpy as np
import tensorflow as tf
import kolo.tensorflow as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

# Initialize Horovod
hvd.init()

# Synthetic MNIST: 28x28 images, 10 classes, a different shard per rank.
rng = np.random.default_rng(hvd.rank())
images = rng.random((args.steps * args.batch_size, 28, 28, 1), dtype=np.float32)
labels = rng.integers(0, 10, size=(args.steps * args.batch_size,))
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(args.batch_size)

mnist_model = tf.keras.Sequential([
    tf.keras.Input(shape=(28, 28, 1)),
    tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
loss = tf.losses.SparseCategoricalCrossentropy()

# Horovod: adjust learning rate based on number of GPUs.
opt = tf.optimizers.Adam(0.001 * hvd.size())


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: add Horovod Distributed GradientTape.
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    #
    # Note: broadcast should be done after the first gradient step to ensure optimizer
    # initialization.
    if first_batch:
        hvd.broadcast_variables(mnist_model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)

    return loss_value


# Horovod: adjust number of steps based on number of GPUs.
for batch, (images, labels) in enumerate(dataset.take(args.steps // hvd.size())):
    loss_value = training_step(images, labels, batch == 0)

    if batch % 10 == 0 and hvd.local_rank() == 0:
        print("Step #%d\tLoss: %.6f" % (batch, loss_value))

# The ranks' weights are identical: every update was the same everywhere.
flat = tf.concat([tf.reshape(v, [-1]) for v in mnist_model.variables], 0)
gathered = hvd.allgather(tf.expand_dims(flat, 0)).numpy()
if hvd.rank() == 0:
    same = all(np.array_equal(gathered[0], g) for g in gathered)
    print("Done: %d ranks, %s" % (hvd.size(), "identical weights" if same else "WEIGHTS DIFFER"))
