"""Codecs of the compressed exchange (``--compress``, geodml.algorithms.compressed): pure functions and
small stateless classes that turn a float32 vector into the bytes that go on the wire and back.

Each quantizer has ``nbytes(n)`` (the payload of an n-vector: every byte charged, scales included),
``encode(x, out)`` and ``decode_add(payload, out)`` (``out += decoded``), on CPU NumPy arrays.

* :class:`BlockQuant` (``int8``, ``int4``): blocks of BLOCK = 64 entries, one float32 scale per block,
  max |x| / q_max (q_max 127 or 7), each entry x q_max / max |x| rounded to the nearest q in
  [-q_max, q_max] (ties to even), decoded as q x scale.
  int8 stores q as a signed byte, int4 as q + 8 in a nibble, two per byte (the first in the high
  nibble). Payload: [scales | codes]: 4 ceil(n / 64) + n (int8) or + ceil(n / 2) (int4) bytes.
* :class:`QSGD` (Alistarh et al. 2017, "QSGD: Communication-Efficient SGD via Gradient Quantization
  and Encoding", NeurIPS, Section 3.1): s levels, stochastic rounding, unbiased. Per bucket of
  BUCKET = 512 entries (the paper quantizes bucket by bucket; the size is geodml's), its L2 norm
  (float32) and for each entry l + 1 with probability |x_i| s / ||x|| - l (l its floor), else l,
  with the sign: a level in [-s, s]. Encoding (geodml's choice; the paper's Elias code has a variable
  length): each level as level + s in ceil(log2(2s + 1)) bits, packed big-endian, so the payload
  has a fixed size, 4 ceil(n / 512) + ceil(n b / 8) bytes, the same on every rank and step.
* PowerSGD (Vogels, Karimireddy & Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression for
  Distributed Optimization", NeurIPS, Algorithm 1; torch.distributed.algorithms.ddp_comm_hooks.
  powerSGD_hook defines the details followed here): :func:`powersgd_layout` says which parameters
  are compressed (torch's rule: a tensor of >= 2 dimensions viewed as shape[0] x rest, compressed
  when n m >= 2 (n + m) r', r' = min(r, n, m); the rest goes uncompressed) and
  :func:`orthogonalize_` is torch's Gram-Schmidt on the columns (with eps 1e-8 added to each norm,
  where torch's default 0 would divide a zero column by zero).
* :class:`E3M0` (Streaming DiLoCo's 4-bit outer gradients): its own docstring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 64
"""Entries per scale of the int8 / int4 block quantizer."""
BUCKET = 512
"""Entries per norm of QSGD."""
MIN_COMPRESSION_RATE = 2.0
"""PowerSGD compresses a matrix only when n m >= this x (n + m) r' (torch's ``min_compression_rate``)."""
ORTHO_EPS = 1e-8


class BlockQuant:
    """int8 / int4 block quantization with per-block float32 scales (module docstring)."""

    def __init__(self, bits: int) -> None:
        if bits not in (4, 8):
            raise ValueError(f"block quantization has 4 or 8 bits, got {bits!r}")
        self.bits = bits
        self.qmax = 2 ** (bits - 1) - 1

    def nbytes(self, n: int) -> int:
        codes = n if self.bits == 8 else (n + 1) // 2
        return 4 * math.ceil(n / BLOCK) + codes

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        n = x.size
        nb = math.ceil(n / BLOCK)
        padded = np.zeros(nb * BLOCK, np.float32)
        padded[:n] = x
        blocks = padded.reshape(nb, BLOCK)
        absmax = np.abs(blocks).max(axis=1)
        scales = absmax / np.float32(self.qmax)
        inv = np.float32(self.qmax) / np.where(absmax > 0, absmax, np.float32(1))      # q = rint(x q_max / max|x|)
        q = np.clip(np.rint(blocks * inv[:, None]), -self.qmax, self.qmax).astype(np.int8).reshape(-1)[:n]
        out[:4 * nb] = scales.astype(np.float32).view(np.uint8)
        codes = out[4 * nb:]
        if self.bits == 8:
            codes[:] = q.view(np.uint8)
        else:
            u = (q.astype(np.int16) + 8).astype(np.uint8)
            if n % 2:
                u = np.append(u, np.uint8(8))
            codes[:] = (u[0::2] << 4) | u[1::2]

    def decode_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        n = out.size
        nb = math.ceil(n / BLOCK)
        scales = payload[:4 * nb].view(np.float32)
        codes = payload[4 * nb:]
        if self.bits == 8:
            q = codes.view(np.int8).astype(np.float32)
        else:
            q = np.empty(2 * codes.size, np.float32)
            q[0::2] = (codes >> 4).astype(np.float32) - 8
            q[1::2] = (codes & 0x0F).astype(np.float32) - 8
            q = q[:n]
        out += q * np.repeat(scales, BLOCK)[:n]


class QSGD:
    """QSGD with ``levels`` = s quantization levels per sign, per bucket of BUCKET entries (module docstring)."""

    def __init__(self, levels: int) -> None:
        if not isinstance(levels, int) or levels < 1:
            raise ValueError(f"QSGD needs an integer number of levels >= 1, got {levels!r}")
        self.levels = levels
        self.bits = max(1, math.ceil(math.log2(2 * levels + 1)))

    def nbytes(self, n: int) -> int:
        return 4 * math.ceil(n / BUCKET) + math.ceil(n * self.bits / 8)

    def encode(self, x: np.ndarray, out: np.ndarray, rng: np.random.Generator) -> None:
        n, s = x.size, self.levels
        nb = math.ceil(n / BUCKET)
        padded = np.zeros(nb * BUCKET, np.float32)
        padded[:n] = x
        buckets = padded.reshape(nb, BUCKET)
        norms = np.sqrt(np.einsum("ij,ij->i", buckets.astype(np.float64), buckets.astype(np.float64))).astype(np.float32)
        safe = np.where(norms > 0, norms, np.float32(1))
        r = (np.abs(buckets) / safe[:, None] * np.float32(s)).reshape(-1)[:n]
        low = np.floor(r)
        level = low + (rng.random(n, dtype=np.float32) < (r - low))
        signed = np.where(x < 0, -level, level).astype(np.int64) + s            # in [0, 2s]
        out[:4 * nb] = norms.view(np.uint8)
        shifts = np.arange(self.bits - 1, -1, -1, dtype=np.int64)
        bits = ((signed[:, None] >> shifts) & 1).astype(np.uint8)
        out[4 * nb:] = np.packbits(bits.reshape(-1))

    def decode_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        n, s = out.size, self.levels
        nb = math.ceil(n / BUCKET)
        norms = payload[:4 * nb].view(np.float32)
        bits = np.unpackbits(payload[4 * nb:], count=n * self.bits).reshape(n, self.bits)
        weights = (1 << np.arange(self.bits - 1, -1, -1, dtype=np.int64))
        level = (bits.astype(np.int64) @ weights) - s
        out += level.astype(np.float32) * (np.repeat(norms, BUCKET)[:n] / np.float32(s))


@dataclass(frozen=True)
class Matrix:
    """One PowerSGD-compressed parameter: its span in the flat vector, viewed as rows x cols, and its rank."""

    offset: int
    rows: int
    cols: int
    rank: int


def powersgd_layout(shapes: Sequence[tuple[int, ...]], rank: int) -> tuple[list[Matrix], list[tuple[int, int]]]:
    """The compressed matrices and the uncompressed ``(offset, numel)`` spans of a flat vector holding
    parameters of ``shapes`` in order (torch's rule, module docstring)."""
    matrices: list[Matrix] = []
    plain: list[tuple[int, int]] = []
    offset = 0
    for shape in shapes:
        numel = math.prod(shape)
        if len(shape) >= 2:
            n, m = shape[0], numel // shape[0]
            r = min(rank, n, m)
            if n * m >= MIN_COMPRESSION_RATE * (n + m) * r:
                matrices.append(Matrix(offset, n, m, r))
                offset += numel
                continue
        if plain and plain[-1][0] + plain[-1][1] == offset:
            plain[-1] = (plain[-1][0], plain[-1][1] + numel)
        else:
            plain.append((offset, numel))
        offset += numel
    return matrices, plain


def orthogonalize_(p: torch.Tensor) -> None:
    """Gram-Schmidt on the columns of ``p`` in place (torch's ``_orthogonalize_gram_schmidt``, eps 1e-8)."""
    for i in range(p.shape[1]):
        col = p[:, i:i + 1]
        col.div_(torch.linalg.vector_norm(col) + ORTHO_EPS)
        if i + 1 < p.shape[1]:
            rest = p[:, i + 1:]
            rest.sub_((col * rest).sum(dim=0, keepdim=True) * col)


def powersgd_nbytes(matrices: Sequence[Matrix], plain: Sequence[tuple[int, int]]) -> tuple[int, int, int]:
    """float32 bytes of one step's three all-reduced vectors: the uncompressed spans, the P's, the Q's."""
    return (4 * sum(n for _, n in plain), 4 * sum(m.rows * m.rank for m in matrices),
            4 * sum(m.cols * m.rank for m in matrices))



class E3M0:
    """4-bit floating point with 1 sign bit, 3 exponent bits and no mantissa (Streaming DiLoCo's outer
    gradients, Douillard et al. 2025), per block of BLOCK entries scaled by the block's max |x| (float32;
    the scaling is geodml's: the paper's text does not give one). Magnitude code e in 0..7: 0 is zero,
    e >= 1 is max|x| 2^(e - 7); each entry rounds to the nearest such value (linear distance, ties up).
    Codes as sign << 3 | e, two a byte (the first in the high nibble): 4 ceil(n / 64) + ceil(n / 2) bytes."""

    def nbytes(self, n: int) -> int:
        return 4 * math.ceil(n / BLOCK) + (n + 1) // 2

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        n = x.size
        nb = math.ceil(n / BLOCK)
        padded = np.zeros(nb * BLOCK, np.float32)
        padded[:n] = x
        blocks = padded.reshape(nb, BLOCK)
        scales = np.abs(blocks).max(axis=1)
        r = (np.abs(blocks) / np.where(scales > 0, scales, np.float32(1))[:, None]).reshape(-1)[:n]
        levels = np.float32(2.0) ** np.arange(-6, 1, dtype=np.float32)           # e = 1..7
        cand = np.concatenate([[np.float32(0)], levels])
        # the nearest of the 8 magnitudes: the first midpoint above r gives the code
        mids = (cand[:-1] + cand[1:]) / np.float32(2)
        e = np.searchsorted(mids, r, side="left").astype(np.uint8)
        code = ((x < 0).astype(np.uint8) << 3) | e
        if n % 2:
            code = np.append(code, np.uint8(0))
        out[:4 * nb] = scales.astype(np.float32).view(np.uint8)
        out[4 * nb:] = (code[0::2] << 4) | code[1::2]

    def decode_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        n = out.size
        nb = math.ceil(n / BLOCK)
        scales = payload[:4 * nb].view(np.float32)
        codes = payload[4 * nb:]
        c = np.empty(2 * codes.size, np.uint8)
        c[0::2], c[1::2] = codes >> 4, codes & 0x0F
        c = c[:n]
        e = (c & 0x7).astype(np.int32)
        mag = np.where(e > 0, np.ldexp(np.float32(1), e - 7), np.float32(0)).astype(np.float32)
        sign = np.where(c & 0x8, np.float32(-1), np.float32(1))
        out += sign * mag * np.repeat(scales, BLOCK)[:n]


__all__ = ["BLOCK", "BUCKET", "MIN_COMPRESSION_RATE", "BlockQuant", "E3M0", "Matrix", "QSGD", "orthogonalize_",
           "powersgd_layout", "powersgd_nbytes"]
