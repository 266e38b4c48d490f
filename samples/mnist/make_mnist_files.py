"""Writes MNIST-format files (idx) into DIR as torch::data::datasets::MNIST
reads them, which insists on 60000 training and 10000 test examples: seeded,
learnable stand-ins for the real digits (no download here).

usage: make_mnist_files.py DIR"""
import os
import random
import struct
import sys

TRAIN, TEST = 60000, 10000


def variants(rng):
    """A few noisy 28x28 images per label: a label-dependent vertical stripe."""
    out = []
    for label in range(10):
        images = []
        for _ in range(8):
            pixels = bytearray()
            for row in range(28):
                for col in range(28):
                    on = 2 + 2 * label <= col < 5 + 2 * label and 4 <= row < 24
                    pixels.append(min(255, (200 if on else 0) + rng.randrange(40)))
            images.append(bytes(pixels))
        out.append(images)
    return out


def write_set(directory, prefix, count, images, rng):
    labels = bytes(rng.randrange(10) for _ in range(count))
    body = b"".join(images[label][rng.randrange(8)] for label in labels)
    with open(os.path.join(directory, prefix + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 2051, count, 28, 28) + body)
    with open(os.path.join(directory, prefix + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 2049, count) + labels)


def main():
    directory = sys.argv[1]
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(0)
    images = variants(rng)
    write_set(directory, "train", TRAIN, images, rng)
    write_set(directory, "t10k", TEST, images, rng)


if __name__ == "__main__":
    main()
