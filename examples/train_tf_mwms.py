"""Train a small Keras classifier on digits with TensorFlow's MultiWorkerMirroredStrategy.

Start one process per worker with ``TF_CONFIG`` set; ``paralela launch`` does that::

    paralela launch --nproc 2 examples/train_tf_mwms.py --out results.json

Every worker holds a full copy of the model; each step, each worker computes
gradients on its part of the global batch and the workers all-reduce them, so all
copies stay equal. The chief (task ``chief``, or ``worker`` 0 when there is none)
prints and writes the final test accuracy and loss to ``--out``.

The training loop is written by hand (``strategy.run`` + ``strategy.reduce``):
Keras 3's ``model.fit`` does not work under MultiWorkerMirroredStrategy (see
docs/tensorflow.md).

Input: explicit sharding. The data are in memory, so there are no files to shard;
``distribute_datasets_from_function`` gives each worker its own pipeline, which keeps
every ``input_pipeline_id``-th example and batches it at the per-replica batch size.
Every worker runs the same fixed number of steps per epoch (the pipeline repeats), so
no worker waits in an all-reduce for a peer that ran out of data.

Exits with status 2 and a message when ``TF_CONFIG`` is missing or unusable for this
strategy, and with a non-zero status when a peer fails or the collectives time out
(``--timeout``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

# Before TensorFlow is imported: hide its INFO/WARNING start-up lines. oneDNN's
# notice can only be hidden by turning oneDNN off, which for a model this small costs
# nothing and keeps float results independent of oneDNN's operation order.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def fail(message: str) -> NoReturn:
    """Print ``error: message`` to stderr and exit with status 2 (a usage error)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_tf_config() -> dict[str, Any]:
    """The parsed ``TF_CONFIG``; exit with status 2 and a message when it is unusable."""
    raw = os.environ.get("TF_CONFIG")
    hint = (
        "Start this script with `paralela launch --nproc N examples/train_tf_mwms.py`, "
        "which sets TF_CONFIG for every rank, or set it yourself, e.g. "
        'TF_CONFIG=\'{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, '
        '"task": {"type": "worker", "index": 0}}\'.'
    )
    if not raw:
        fail(f"TF_CONFIG is not set, so this worker cannot find its cluster. {hint}")
    try:
        config = json.loads(raw)
        cluster, task = config["cluster"], config["task"]
        task_type, task_index = task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError) as exc:
        fail(f"TF_CONFIG={raw!r} is not a valid cluster spec ({exc!r}). {hint}")
    if set(cluster) - {"chief", "worker"}:
        fail(
            f"TF_CONFIG has task types {sorted(cluster)}, but MultiWorkerMirroredStrategy "
            "takes only 'chief' and 'worker' (no 'ps'): launch without --tf-ps."
        )
    if task_type not in cluster or not 0 <= task_index < len(cluster[task_type]):
        fail(f"TF_CONFIG task {task} is not in its cluster {cluster}. {hint}")
    return dict(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="JSON file the chief writes its results to")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a collective may wait for peers"
    )
    args = parser.parse_args()
    config = read_tf_config()
    task_type, task_index = config["task"]["type"], int(config["task"]["index"])
    cluster = config["cluster"]
    is_chief = task_type == "chief" or (
        task_type == "worker" and task_index == 0 and "chief" not in cluster
    )
    started = time.monotonic()

    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    # One thread per worker (several workers share this machine's cores); this must
    # happen before the strategy starts TensorFlow's runtime.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(0)  # repeatable runs (the chief broadcasts its init)

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=args.timeout,
        )
    )
    replicas = strategy.num_replicas_in_sync
    if args.global_batch_size % replicas:
        fail(
            f"--global-batch-size {args.global_batch_size} does not split evenly over "
            f"{replicas} replicas; pass a multiple of {replicas}."
        )

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    steps_per_epoch = len(x_train) // args.global_batch_size

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica = ctx.get_per_replica_batch_size(args.global_batch_size)
        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        ds = ds.shuffle(len(x_train), seed=ctx.input_pipeline_id, reshuffle_each_iteration=True)
        return ds.repeat().batch(per_replica, drop_remainder=True).prefetch(2)

    dist_ds = strategy.distribute_datasets_from_function(dataset_fn)

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(64,)),
                tf.keras.layers.Dense(64, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        optimizer = tf.keras.optimizers.Adam(args.lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def step_fn(features: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            per_example = loss_fn(labels, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        # Which replicas contributed to this step, as a one-hot over replica ids.
        ctx = tf.distribute.get_replica_context()
        seen = tf.one_hot(ctx.replica_id_in_sync_group, replicas)
        return loss, tf.cast(tf.shape(labels)[0], tf.float32), seen

    @tf.function
    def train_step(iterator: Any) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        loss, count, seen = strategy.run(step_fn, args=next(iterator))
        add = tf.distribute.ReduceOp.SUM
        return (
            strategy.reduce(add, loss, axis=None),
            strategy.reduce(add, count, axis=None),
            strategy.reduce(add, seen, axis=None),
        )

    iterator = iter(dist_ds)
    examples = 0.0
    seen_total = np.zeros(replicas)
    train_loss = float("nan")
    for epoch in range(args.epochs):
        losses = []
        for _ in range(steps_per_epoch):
            loss, count, seen = train_step(iterator)
            losses.append(float(loss))
            examples += float(count)
            seen_total += seen.numpy()
        train_loss = float(np.mean(losses))
        if is_chief:
            print(f"epoch {epoch + 1}/{args.epochs}: train loss {train_loss:.4f}", flush=True)

    # The weights are the same on every worker, so each can score the test set alone.
    logits = model(x_test, training=False)
    test_loss = float(tf.reduce_mean(loss_fn(y_test, logits)))
    accuracy = float(np.mean(np.argmax(logits.numpy(), axis=1) == y_test))
    checksum = float(sum(np.abs(w).sum() for w in model.get_weights()))
    steps = args.epochs * steps_per_epoch
    print(
        f"{task_type} {task_index}: {steps} steps, test accuracy {accuracy:.4f}, "
        f"weights checksum {checksum:.6f}",
        flush=True,
    )
    if not is_chief:
        return
    results = {
        "accuracy": accuracy,
        "test_loss": test_loss,
        "train_loss": train_loss,
        "epochs": args.epochs,
        "steps": steps,
        "global_batch_size": args.global_batch_size,
        "examples_seen": int(examples),
        "num_workers": sum(len(tasks) for tasks in cluster.values()),
        "num_replicas_in_sync": replicas,
        "steps_per_replica": [int(n) for n in seen_total],
        "weights_checksum": checksum,
        "wall_s": round(time.monotonic() - started, 2),
    }
    print(
        f"chief: {replicas} replicas, test accuracy {accuracy:.4f}, test loss {test_loss:.4f}",
        flush=True,
    )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
