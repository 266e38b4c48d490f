"""Corrupt copies of an HDF5 file whose size fields declare far more than the
file holds: what a flipped bit or a hostile sender does to a run file,
snapshot, checkpoint or data file, made on purpose, one field at a time.

For each HDF5 structure found by its signature, the field that tells the
library how much to allocate is set to a huge value, and the structure's
checksum is made to match again where it covers that field (so the library
believes it and acts on it):
  OHDR  an object header's first chunk size (its checksum lies past the end
        of the declared chunk, so the library must read the whole chunk first)
  OH1   a version-1 object header's size (no checksum; found from the root
        group's entry in the superblock and each symbol table node's entries)
  HEAP  a local heap's data segment size (group names; no checksum)
  FRHP  a fractal heap's starting and largest direct block sizes (dense
        attribute and link storage; checksummed)
  BTHD  a version-2 B-tree's node size (indexes of dense storage; checksummed)
The superblock is left alone: a file whose end of file lies is refused by
HDF5 itself at once.

    python3 size_mutants.py GOOD.h5 OUT_DIR      # writes OUT_DIR/<signature>-<offset>.h5
"""
import pathlib
import struct
import sys

HUGE = (1 << 40) + 12345  # a terabyte and some: no file here is near it


def _rot(x, k):
    return ((x << k) | (x >> (32 - k))) & 0xFFFFFFFF


def lookup3(data, initval=0):
    """Bob Jenkins' lookup3 hashlittle, as HDF5's H5_checksum_lookup3 computes it."""
    length = len(data)
    a = b = c = (0xDEADBEEF + length + initval) & 0xFFFFFFFF
    i = 0
    while length > 12:
        a = (a + data[i] + (data[i + 1] << 8) + (data[i + 2] << 16) + (data[i + 3] << 24)) & 0xFFFFFFFF
        b = (b + data[i + 4] + (data[i + 5] << 8) + (data[i + 6] << 16) + (data[i + 7] << 24)) & 0xFFFFFFFF
        c = (c + data[i + 8] + (data[i + 9] << 8) + (data[i + 10] << 16) + (data[i + 11] << 24)) & 0xFFFFFFFF
        a = (a - c) & 0xFFFFFFFF; a ^= _rot(c, 4); c = (c + b) & 0xFFFFFFFF
        b = (b - a) & 0xFFFFFFFF; b ^= _rot(a, 6); a = (a + c) & 0xFFFFFFFF
        c = (c - b) & 0xFFFFFFFF; c ^= _rot(b, 8); b = (b + a) & 0xFFFFFFFF
        a = (a - c) & 0xFFFFFFFF; a ^= _rot(c, 16); c = (c + b) & 0xFFFFFFFF
        b = (b - a) & 0xFFFFFFFF; b ^= _rot(a, 19); a = (a + c) & 0xFFFFFFFF
        c = (c - b) & 0xFFFFFFFF; c ^= _rot(b, 4); b = (b + a) & 0xFFFFFFFF
        length -= 12
        i += 12
    if length == 0:
        return c
    tail = data[i:i + length] + bytes(12 - length)
    k = [tail[j] + (tail[j + 1] << 8) + (tail[j + 2] << 16) + (tail[j + 3] << 24) for j in (0, 4, 8)]
    # Only the bytes that exist are added (the zero padding adds nothing).
    a = (a + k[0]) & 0xFFFFFFFF
    b = (b + k[1]) & 0xFFFFFFFF
    c = (c + k[2]) & 0xFFFFFFFF
    c ^= b; c = (c - _rot(b, 14)) & 0xFFFFFFFF
    a ^= c; a = (a - _rot(c, 11)) & 0xFFFFFFFF
    b ^= a; b = (b - _rot(a, 25)) & 0xFFFFFFFF
    c ^= b; c = (c - _rot(b, 16)) & 0xFFFFFFFF
    a ^= c; a = (a - _rot(c, 4)) & 0xFFFFFFFF
    b ^= a; b = (b - _rot(a, 14)) & 0xFFFFFFFF
    c ^= b; c = (c - _rot(b, 24)) & 0xFFFFFFFF
    return c


def _offsets(data, signature):
    start = 0
    while (at := data.find(signature, start)) >= 0:
        yield at
        start = at + 1


def _sizes(data):
    """HDF5's size of offsets and of lengths, from the superblock (8 and 8 unless it says otherwise)."""
    at = data.find(b"\x89HDF\r\n\x1a\n")
    if at < 0:
        return 8, 8
    version = data[at + 8]
    if version >= 2:
        return data[at + 9], data[at + 10]
    return data[at + 13], data[at + 14]


def _v1_object_headers(data):
    """Addresses of version-1 object headers: the root group's (from a version
    0 or 1 superblock) and every symbol table node's entries."""
    at = data.find(b"\x89HDF\r\n\x1a\n")
    if at < 0 or data[at + 8] > 1:
        return []
    o = data[at + 13]
    root_entry = at + 24 + (4 if data[at + 8] == 1 else 0) + 4 * o
    headers = {int.from_bytes(data[root_entry + o:root_entry + 2 * o], "little")}
    for node in _offsets(data, b"SNOD"):
        for i in range(struct.unpack_from("<H", data, node + 6)[0]):
            entry = node + 8 + i * (2 * o + 24)
            headers.add(int.from_bytes(data[entry + o:entry + 2 * o], "little"))
    # A version-1 header starts with version 1 and a reserved zero.
    return sorted(a for a in headers if a + 16 <= len(data) and data[a] == 1 and data[a + 1] == 0)


def _put(data, at, width, value):
    data[at:at + width] = min(value, (1 << (8 * width - 1)) - 1).to_bytes(width, "little")


def _reseal(data, start, checksum_at):
    """Makes a structure's checksum (over start .. checksum_at) match its bytes again."""
    data[checksum_at:checksum_at + 4] = struct.pack("<I", lookup3(bytes(data[start:checksum_at])))


def mutants(good):
    """(name, bytes) of each mutant of `good` (the file's bytes)."""
    o, l = _sizes(good)
    for at in _offsets(good, b"OHDR"):
        flags = good[at + 5]
        field = at + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        width = 1 << (flags & 3)
        if width >= 4:
            m = bytearray(good)
            _put(m, field, width, HUGE)
            yield f"OHDR-{at}", bytes(m)
    for at in _v1_object_headers(good):
        m = bytearray(good)
        _put(m, at + 8, 4, HUGE)  # version, reserved, message count (2), reference count (4), header size (4)
        yield f"OH1-{at}", bytes(m)
    for at in _offsets(good, b"HEAP"):
        if good[at + 4] == 0:  # version 0
            m = bytearray(good)
            _put(m, at + 8, l, HUGE)
            yield f"HEAP-{at}", bytes(m)
    for at in _offsets(good, b"FRHP"):
        if good[at + 4] != 0:
            continue
        # signature, version, heap ID length (2), filters length (2), flags, max
        # managed object size (4), then 12 lengths/addresses before the table's width.
        p = at + 4 + 1 + 2 + 2 + 1 + 4
        p += l + o + l + o + l + l + l + l + l + l + l + l  # next huge id .. number of tiny objects
        table_width = p
        starting_block, max_direct_block = table_width + 2, table_width + 2 + l
        filters_length = struct.unpack_from("<H", good, at + 7)[0]
        end = max_direct_block + l + 2 + 2 + o + 2 + (l + 4 + filters_length if filters_length else 0)
        m = bytearray(good)
        _put(m, starting_block, l, HUGE)
        _put(m, max_direct_block, l, HUGE)
        _reseal(m, at, end)
        yield f"FRHP-{at}", bytes(m)
    for at in _offsets(good, b"BTHD"):
        if good[at + 4] != 0:
            continue
        # signature, version, type, node size (4), record size (2), depth (2),
        # split and merge percent, root address, records in root (2), total records.
        end = at + 4 + 1 + 1 + 4 + 2 + 2 + 1 + 1 + o + 2 + l
        m = bytearray(good)
        _put(m, at + 6, 4, HUGE)
        _reseal(m, at, end)
        yield f"BTHD-{at}", bytes(m)


def main():
    good = pathlib.Path(sys.argv[1]).read_bytes()
    out = pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for name, data in mutants(good):
        (out / f"{name}.h5").write_bytes(data)
        print(out / f"{name}.h5")


if __name__ == "__main__":
    main()
