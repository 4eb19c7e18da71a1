"""A small reverse-mode autodiff over NumPy float64 arrays, for the mHC reference.

Written for tools/reference only (it shares nothing with mhcc's compile-time
autodiff): every operation records its inputs and a vector-Jacobian product;
`backward` walks the recorded graph in reverse creation order. The Sinkhorn
iterations, softmax and norms are composed from these elementary operations,
so their gradients come from the chain rule, not from hand-derived formulas.
"""
import itertools
import os

import numpy as np

_counter = itertools.count()
# float64 normally. MHC_REFERENCE_DTYPE=float32 rounds every value and
# gradient to float32, to measure how far fp32 round-off alone moves the
# results (docs/reference.md).
DTYPE = np.dtype(os.environ.get("MHC_REFERENCE_DTYPE", "float64"))


class Var:
    """A value, its gradient (leaves only) and how to differentiate it."""

    __slots__ = ("value", "grad", "parents", "vjp", "needs_grad", "order")

    def __init__(self, value, parents=(), vjp=None, needs_grad=False):
        self.value = np.asarray(value, dtype=DTYPE)
        self.grad = None
        self.parents = parents
        self.vjp = vjp
        self.needs_grad = needs_grad or any(p.needs_grad for p in parents)
        self.order = next(_counter)

    @property
    def shape(self):
        return self.value.shape

    def __add__(self, o): return add(self, o)
    def __radd__(self, o): return add(o, self)
    def __sub__(self, o): return sub(self, o)
    def __rsub__(self, o): return sub(o, self)
    def __mul__(self, o): return mul(self, o)
    def __rmul__(self, o): return mul(o, self)
    def __truediv__(self, o): return div(self, o)
    def __rtruediv__(self, o): return div(o, self)
    def __matmul__(self, o): return matmul(self, o)
    def __neg__(self): return mul(self, -1.0)
    def __getitem__(self, index): return getitem(self, index)


def param(value):
    """A leaf whose gradient `backward` stores in .grad."""
    return Var(np.array(value, dtype=DTYPE), needs_grad=True)


def const(value):
    return value if isinstance(value, Var) else Var(value)


def _unbroadcast(g, shape):
    """Sums a broadcast gradient back to an operand's shape."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


def _make(value, parents, vjp):
    parents = tuple(parents)
    if not any(p.needs_grad for p in parents):
        return Var(value)
    return Var(value, parents, vjp)


def add(a, b):
    a, b = const(a), const(b)
    return _make(a.value + b.value, (a, b),
                 lambda g: (_unbroadcast(g, a.shape), _unbroadcast(g, b.shape)))


def sub(a, b):
    a, b = const(a), const(b)
    return _make(a.value - b.value, (a, b),
                 lambda g: (_unbroadcast(g, a.shape), _unbroadcast(-g, b.shape)))


def mul(a, b):
    a, b = const(a), const(b)
    return _make(a.value * b.value, (a, b),
                 lambda g: (_unbroadcast(g * b.value, a.shape), _unbroadcast(g * a.value, b.shape)))


def div(a, b):
    a, b = const(a), const(b)
    out = a.value / b.value
    return _make(out, (a, b),
                 lambda g: (_unbroadcast(g / b.value, a.shape), _unbroadcast(-g * out / b.value, b.shape)))


def matmul(a, b):
    """np.matmul on operands of at least two dimensions (batch dims broadcast)."""
    a, b = const(a), const(b)
    swap = lambda x: np.swapaxes(x, -1, -2)
    return _make(a.value @ b.value, (a, b),
                 lambda g: (_unbroadcast(g @ swap(b.value), a.shape), _unbroadcast(swap(a.value) @ g, b.shape)))


def exp(a):
    out = np.exp(a.value)
    return _make(out, (a,), lambda g: (g * out,))


def log(a):
    return _make(np.log(a.value), (a,), lambda g: (g / a.value,))


def sqrt(a):
    out = np.sqrt(a.value)
    return _make(out, (a,), lambda g: (g * 0.5 / out,))


def sigmoid(a):
    out = 1.0 / (1.0 + np.exp(-a.value))
    return _make(out, (a,), lambda g: (g * out * (1.0 - out),))


def clamp_min(a, floor):
    """max(a, floor): the gradient passes only where a is above the floor."""
    return _make(np.maximum(a.value, floor), (a,), lambda g: (g * (a.value > floor),))


def sum(a, axis, keepdims=False):
    def vjp(g):
        if not keepdims:
            g = np.expand_dims(g, axis)
        return (np.broadcast_to(g, a.shape).copy(),)
    return _make(a.value.sum(axis=axis, keepdims=keepdims), (a,), vjp)


def mean(a, axis, keepdims=False):
    return mul(sum(a, axis, keepdims), 1.0 / a.shape[axis])


def reshape(a, shape):
    return _make(a.value.reshape(shape), (a,), lambda g: (g.reshape(a.shape),))


def transpose(a, axes):
    inverse = np.argsort(axes)
    return _make(np.transpose(a.value, axes), (a,), lambda g: (np.transpose(g, inverse),))


def getitem(a, index):
    def vjp(g):
        full = np.zeros(a.shape)
        np.add.at(full, index, g)
        return (full,)
    return _make(a.value[index], (a,), vjp)


def concat(parts, axis):
    sizes = [p.shape[axis] for p in parts]
    cuts = np.cumsum(sizes)[:-1]
    return _make(np.concatenate([p.value for p in parts], axis=axis), parts,
                 lambda g: tuple(np.split(g, cuts, axis=axis)))


def rows(table, ids):
    """table[ids] for an integer array ids (an embedding lookup)."""
    ids = np.asarray(ids)

    def vjp(g):
        full = np.zeros(table.shape)
        np.add.at(full, ids, g)
        return (full,)
    return _make(table.value[ids], (table,), vjp)


def pick(a, ids):
    """a[t, ids[t]] for every row t of a 2-D a."""
    ids = np.asarray(ids)
    index = (np.arange(a.shape[0]), ids)
    return getitem(a, index)


def backward(root):
    """d root / d leaf into every reachable param's .grad (root: a scalar)."""
    nodes, stack, seen = [], [root], {id(root)}
    while stack:
        node = stack.pop()
        nodes.append(node)
        for p in node.parents:
            if p.needs_grad and id(p) not in seen:
                seen.add(id(p))
                stack.append(p)
    grads = {id(root): np.ones(root.shape, dtype=DTYPE)}
    for node in sorted(nodes, key=lambda v: v.order, reverse=True):
        g = grads.pop(id(node), None)
        if g is None:
            continue
        if node.vjp is None:  # a leaf parameter
            node.grad = g if node.grad is None else node.grad + g
            continue
        for p, pg in zip(node.parents, node.vjp(g)):
            if p.needs_grad:
                pg = np.asarray(pg, dtype=DTYPE)
                grads[id(p)] = pg if id(p) not in grads else grads[id(p)] + pg
