"""One worker of the TF2 synthetic benchmark (examples/tensorflow2_synthetic_benchmark.py)
under tf.distribute.MultiWorkerMirroredStrategy, TensorFlow's own
multi-worker data parallelism: TF_CONFIG names the workers (loopback ports),
the gradients are all-reduced by TensorFlow's CPU collectives (RING over its
gRPC runtime; Keras' optimizer sums them across the workers in
apply_gradients). The same model, batch, optimizer and timing as the kolo
example; worker 0 prints the same "Total img/sec on N CPU(s): X +-Y" line.
Started by bench/tf_vs_mwms.py (one process per worker)."""
import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.keras import applications  # noqa: E402

parser = argparse.ArgumentParser(description="TF2 synthetic benchmark, MultiWorkerMirroredStrategy")
parser.add_argument("--model", type=str, default="ResNet50")
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--num-warmup-batches", type=int, default=10)
parser.add_argument("--num-batches-per-iter", type=int, default=10)
parser.add_argument("--num-iters", type=int, default=10)
parser.add_argument("--bytes-per-pack", type=int, default=0,
                    help="CommunicationOptions.bytes_per_pack (0: TensorFlow chooses)")
args = parser.parse_args()

impl = tf.distribute.experimental.CommunicationImplementation.RING
options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=args.bytes_per_pack,
                                                          implementation=impl)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
workers = strategy.num_replicas_in_sync
is_chief = strategy.cluster_resolver.task_id == 0

with strategy.scope():
    if args.model == "small":
        model = tf.keras.Sequential([
            tf.keras.Input(shape=(args.image_size, args.image_size, 3)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(1000),
        ])
    else:
        model = getattr(applications, args.model)(weights=None,
                                                  input_shape=(args.image_size, args.image_size, 3))
    opt = tf.optimizers.SGD(0.01)

data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)


def replica_step():
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        per_example = tf.losses.sparse_categorical_crossentropy(target, probs, from_logits=True)
        loss = tf.reduce_sum(per_example) / (args.batch_size * workers)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces (SUM) across workers


@tf.function
def benchmark_step():
    strategy.run(replica_step)


def log(s):
    if is_chief:
        print(s, flush=True)


log("Model: %s" % args.model)
log("Batch size: %d" % args.batch_size)
log("Number of CPUs: %d (MultiWorkerMirroredStrategy, RING, bytes_per_pack %d)"
    % (workers, args.bytes_per_pack))
log("Running warmup...")
benchmark_step()
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / t
    log("Iter #%d: %.1f img/sec per CPU" % (x, img_sec))
    img_secs.append(img_sec)
mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log("Img/sec per CPU: %.1f +-%.1f" % (mean, conf))
log("Total img/sec on %d CPU(s): %.1f +-%.1f" % (workers, workers * mean, workers * conf))
