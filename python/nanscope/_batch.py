"""A batch of any structure as the C++ core holds it: its tensors in order
(the leaves) and a JSON text saying how they nest, so the guard can check,
snapshot, cut rows from and hand back the dict, tuple or list the loop gave.
Non-tensor leaves (a sequence length, a flag) are kept as they are: JSON
values as themselves, anything else pickled."""
import base64
import json
import pickle

import torch


_flat_structures = {}  # (kind, keys or length) -> the structure of a flat dict, tuple or list of tensors


def flatten(batch):
    """(leaves, structure): the tensors of `batch` in order, and how they nest.
    A flat dict, tuple or list of tensors (a tokenizer's batch, as most loops
    give it) has its structure text made once per shape, not at every
    micro-batch."""
    flat = _flat_key(batch)
    if flat is not None:
        structure = _flat_structures.get(flat)
        leaves = list(batch.values()) if isinstance(batch, dict) else list(batch)
        if structure is None:
            if len(_flat_structures) > 256:  # a loop whose batches keep changing keys: no cache
                _flat_structures.clear()
            structure = _flat_structures[flat] = _walked(batch)[1]
        return leaves, structure
    return _walked(batch)


def _flat_key(batch):
    if type(batch) is dict:
        if len(batch) <= 16 and all(type(k) is str and torch.is_tensor(v) for k, v in batch.items()):
            return ("d", *batch)
    elif type(batch) in (tuple, list) and len(batch) <= 16 and all(torch.is_tensor(v) for v in batch):
        return (type(batch).__name__, len(batch))
    return None


def _walked(batch):
    leaves = []

    def encode(node):
        if torch.is_tensor(node):
            leaves.append(node)
            return {"t": len(leaves) - 1}
        if isinstance(node, dict) and all(isinstance(k, str) for k in node):
            return {"d": [[k, encode(v)] for k, v in node.items()]}
        if isinstance(node, tuple) and not hasattr(node, "_fields"):
            return {"u": [encode(v) for v in node]}
        if isinstance(node, list):
            return {"l": [encode(v) for v in node]}
        if node is None or isinstance(node, (bool, int, float, str)):
            return {"v": node}
        return {"p": base64.b64encode(pickle.dumps(node)).decode("ascii")}

    structure = json.dumps(encode(batch))
    return leaves, structure


def unflatten(structure, leaves):
    """The batch `flatten` described, with these tensors in its leaves' places."""
    def decode(node):
        if "t" in node:
            return leaves[node["t"]]
        if "d" in node:
            return {k: decode(v) for k, v in node["d"]}
        if "u" in node:
            return tuple(decode(v) for v in node["u"])
        if "l" in node:
            return [decode(v) for v in node["l"]]
        if "v" in node:
            return node["v"]
        return pickle.loads(base64.b64decode(node["p"]))

    return decode(json.loads(structure))


def call_batch(args, kwargs):
    """The micro-batch a model call makes: its positional arguments as a tuple,
    or its keyword arguments as a dict (model(**batch), as Hugging Face loops call)."""
    if kwargs and args:
        raise TypeError("nanscope: the model was called with positional and keyword arguments; pass the "
                        "micro-batch explicitly: guard.scale(loss, batch) / guard.backward(loss, batch)")
    return dict(kwargs) if kwargs else tuple(args)
