"""Writes small MNIST-format files (idx) into DIR, as torch::data::datasets::MNIST
reads them: seeded random digits, N training and M test examples.

usage: make_mnist_files.py DIR [N] [M]"""
import os
import random
import struct
import sys


def write_set(directory, prefix, count, rng):
    images = bytearray()
    labels = bytearray()
    for _ in range(count):
        label = rng.randrange(10)
        # A digit-dependent stripe, so the task is learnable, plus noise.
        for row in range(28):
            for col in range(28):
                on = 2 + 2 * label <= col < 5 + 2 * label and 4 <= row < 24
                images.append(min(255, (200 if on else 0) + rng.randrange(40)))
        labels.append(label)
    with open(os.path.join(directory, prefix + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 2051, count, 28, 28) + images)
    with open(os.path.join(directory, prefix + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 2049, count) + labels)


def main():
    directory = sys.argv[1]
    train = int(sys.argv[2]) if len(sys.argv) > 2 else 640
    test = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(0)
    write_set(directory, "train", train, rng)
    write_set(directory, "t10k", test, rng)


if __name__ == "__main__":
    main()
