"""Reads safetensors files into NumPy arrays (format: an 8-byte little-endian
header length, a JSON header of dtype / shape / data_offsets, raw
little-endian data). Written from the format's description, not from mhcc's
writer."""
import json
import struct

import numpy as np

_DTYPES = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8"}


def load(path):
    """Returns ({name: array}, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    data = blob[8 + length:]
    metadata = header.pop("__metadata__", {})
    tensors, covered = {}, 0
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = np.dtype(_DTYPES[entry["dtype"]])
        count = int(np.prod(entry["shape"], dtype=np.int64))
        if end - begin != count * dtype.itemsize or end > len(data):
            raise ValueError(f"{path}: {name}: byte range [{begin}, {end}) does not fit its shape")
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(entry["shape"]).copy()
        covered += end - begin
    if covered != len(data):
        raise ValueError(f"{path}: the tensors cover {covered} of {len(data)} data bytes")
    return tensors, metadata
