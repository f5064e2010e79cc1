"""GGUF weights regrouped for the fast arithmetic: 16 output rows side by side, one per vector lane.

GGUF stores a weight row by row, block after block. The int8 kernel (kernels/quant_int8.cpp) multiplies 16 weight
rows at once, each in its own 32-bit lane, so that one integer dot-product instruction serves 16 outputs and a
block's fp32 steps are one vector operation for all 16; it reads them from this layout, built once when a model
takes the fast arithmetic (`group_rows`). The values are the file's; only their places change. Rows past the last
(out is padded to a multiple of 16) are zeros.

Per group of 16 rows and weight block, in bytes (r the row within the group, t = 0..3; fp16 fields as stored):
    Q4_K (2,368 per super-block of 256):
        d[16] | dmin[16] | sc[8][16] u8 | mn[8][16] u8 | qs[4 chunks][8 quads][16 r][4 t]
        qs[i][k][r][t] is row r's qs byte 32i + 4k + t: low nibble = position 64i + 4k + t (sub-block 2i),
        high nibble = position 64i + 32 + 4k + t (sub-block 2i + 1); sc, mn the unpacked 6-bit scales and mins.
    Q6_K (3,360 per super-block, the file's bytes): d[16] | sc[16 sub-blocks][16 r] i8 | 8 pairs of sub-blocks
        p, each ql[4][16 r][4 t] | qh[2][16 r][4 t] (384 bytes, so a block is read front to back). Row r's stored
        6-bit quant (value + 32) at position 4k + t (quad k = 0..63; quads 8p .. 8p + 7 are sub-blocks 2p and
        2p + 1) is split into its low 4 bits, in pair p's ql[c][r][t] (low nibble: quad 8p + c, high nibble: quad
        8p + 4 + c, c = 0..3), and its top 2 bits, in pair p's qh[c // 2][r][t] at bit 2(2(c % 2) + s) for quad
        8p + 4s + c: a vector of 16 rows' quads decodes in a shift, two masks and an or.
    Q8_0 (544 per block of 32): d[16] | q[8 quads][16 r][4 t] i8 (position 4k + t).
    Q5_0 (352): d[16] | qs[4 quads][16 r][4 t] | hi[8 vectors][8 bytes]
        qs[k][r][t] is row r's qs byte 4k + t: low nibble = position 4k + t, high nibble = position 16 + 4k + t;
        hi[4h + k] is a 64-bit mask whose bit 4r + t is the fifth bit of position 16h + 4k + t of row r.
    Q4_1 (320): d[16] | m[16] | qs[4 quads][16 r][4 t] (as Q5_0's).
    Q4_0 (288): d[16] | qs[4 quads][16 r][4 t] (as Q5_0's).
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

ROWS = 16  # weight rows per group: one per lane of a 512-bit vector of int32
GROUP_BYTES = {Q.Q4_K: 2368, Q.Q6_K: 3360, Q.Q8_0: 544, Q.Q5_0: 352, Q.Q4_1: 320, Q.Q4_0: 288}  # per group and block


def q6k_quants(b: np.ndarray) -> np.ndarray:
    """Q6_K super-blocks [..., 210] -> the stored quants (0..63) in natural order [..., 256] uint8: weight
    128h + r is ql[64h + r % 64] >> 4(r // 64) (4 bits) and qh[32h + r % 32] >> 2(r // 32) (2 bits)."""
    halves = []
    for h in range(2):  # slices and shifts only: a gather by an index array took 9 s on the 1.5B's weights
        ql, qh = b[..., 64 * h : 64 * h + 64], b[..., 128 + 32 * h : 160 + 32 * h]  # [..., 64], [..., 32]
        low = np.concatenate([ql & 15, ql >> 4], axis=-1)  # [..., 128]: r < 64 low nibbles, then high
        high = np.concatenate([(qh >> (2 * s)) & 3 for s in range(4)], axis=-1)  # [..., 128]: 32 r per shift
        halves.append(low | (high << 4))
    return np.concatenate(halves, axis=-1).astype(np.uint8)


def _q6k_split(quads: np.ndarray) -> np.ndarray:
    """Q6_K's stored quants by quad [G, nb, 64, 16, 4] -> [G, nb, 8 pairs, 384]: each pair's ql then qh, as the
    module docstring lays them out."""
    g, nb = quads.shape[:2]
    q = quads.reshape(g, nb, 8, 2, 2, 2, 16, 4)  # [G, nb, p, s, c // 2, c % 2, 16 r, 4 t]: quad 8p + 4s + c
    ql = (q[:, :, :, 0] & 15) | ((q[:, :, :, 1] & 15) << 4)  # [G, nb, p, c // 2, c % 2, 16, 4]
    top = (q >> 4).astype(np.uint8)
    qh = np.zeros((g, nb, 8, 2, 16, 4), dtype=np.uint8)  # [G, nb, p, c // 2, 16, 4]
    for s in range(2):
        for odd in range(2):
            qh |= top[:, :, :, s, :, odd] << (2 * (2 * odd + s))
    return np.concatenate([ql.reshape(g, nb, 8, 256), qh.reshape(g, nb, 8, 128)], axis=-1)


def _q6k_join(pairs: np.ndarray) -> np.ndarray:
    """`_q6k_split` undone: [G, nb, 8 pairs, 384] -> quads [G, nb, 64, 16, 4]."""
    g, nb = pairs.shape[:2]
    low = pairs[..., :256].reshape(g, nb, 8, 2, 2, 16, 4)  # [G, nb, p, c // 2, c % 2, 16, 4]
    high = pairs[..., 256:].reshape(g, nb, 8, 2, 16, 4)  # [G, nb, p, c // 2, 16, 4]
    q = np.zeros((g, nb, 8, 2, 2, 2, 16, 4), dtype=np.uint8)  # [G, nb, p, s, c // 2, c % 2, 16, 4]
    for s in range(2):
        for odd in range(2):
            top = (high >> (2 * (2 * odd + s))) & 3
            q[:, :, :, s, :, odd] = ((low[:, :, :, :, odd] >> (4 * s)) & 15) | (top << 4)
    return q.reshape(g, nb, 64, 16, 4)


def _lanes(a: np.ndarray) -> np.ndarray:
    """[G, 16, nb, ...] per row -> [G, nb, ..., 16] with the row innermost (a field's 16 lanes side by side)."""
    return np.moveaxis(a, 1, -1)


def _halves(b: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 field at `offset` of [G, 16, nb, bytes] -> [G, nb, 16, 2]: 16 lanes of fp16 bytes."""
    return _lanes(b[..., offset : offset + 2]).swapaxes(-1, -2)


def _quads(a: np.ndarray) -> np.ndarray:
    """Bytes [G, 16, nb, 4 * Q] per row -> [G, nb, Q, 16, 4]: quad k of every row side by side."""
    g, rows, nb, n = a.shape
    return a.reshape(g, rows, nb, n // 4, 4).transpose(0, 2, 3, 1, 4)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0's qh bytes [G, 16, nb, 4] -> [G, nb, 8, 8]: mask 4h + k's bit 4r + t = bit 16h + 4k + t of row r."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")  # [G, 16, nb, 32]: bit p = position p's fifth bit
    per = bits.reshape(*bits.shape[:3], 2, 4, 4).transpose(0, 2, 3, 4, 1, 5)  # [G, nb, h, k, r, t]
    return np.packbits(per.reshape(*per.shape[:2], 8, 64), axis=-1, bitorder="little")


def group_rows(blocks: torch.Tensor, qtype: Q) -> torch.Tensor:
    """A weight's GGUF blocks [out, bytes_per_row] -> [groups, nb * GROUP_BYTES] uint8 in the module docstring's
    layout, groups = ceil(out / 16)."""
    if qtype not in GROUP_BYTES:
        raise ValueError(f"group_rows takes {', '.join(t.name for t in GROUP_BYTES)}, not {qtype.name}")
    out, type_bytes = blocks.shape[0], gguf.GGML_QUANT_SIZES[qtype][1]
    nb = blocks.shape[1] // type_bytes
    groups = -(-out // ROWS)
    b = np.zeros((groups * ROWS, nb, type_bytes), dtype=np.uint8)
    b[:out] = blocks.numpy().reshape(out, nb, -1)
    b = b.reshape(groups, ROWS, nb, -1)  # [G, 16, nb, bytes]
    if qtype == Q.Q4_K:
        sc, mn = (v.reshape(groups, ROWS, nb, 8) for v in gguf.quants.Q4_K.get_scale_min(b[..., 4:16].reshape(-1, 12)))
        parts = [_halves(b, 0), _halves(b, 2), _lanes(sc), _lanes(mn), _quads(b[..., 16:])]  # quad 8i + k: chunk i
    elif qtype == Q.Q6_K:
        parts = [_halves(b, 208), _lanes(b[..., 192:208]), _q6k_split(_quads(q6k_quants(b)))]
    elif qtype == Q.Q8_0:
        parts = [_halves(b, 0), _quads(b[..., 2:34])]
    elif qtype == Q.Q5_0:
        parts = [_halves(b, 0), _quads(b[..., 6:22]), _fifth_bits(b[..., 2:6])]
    elif qtype == Q.Q4_1:
        parts = [_halves(b, 0), _halves(b, 2), _quads(b[..., 4:20])]
    else:  # Q4_0
        parts = [_halves(b, 0), _quads(b[..., 2:18])]
    flat = np.concatenate([p.reshape(groups, nb, -1) for p in parts], axis=-1)  # [G, nb, GROUP_BYTES]
    assert flat.shape[-1] == GROUP_BYTES[qtype]
    return torch.from_numpy(np.ascontiguousarray(flat).reshape(groups, -1))


def _unlanes(a: np.ndarray) -> np.ndarray:
    """[G, nb, ..., 16] -> [G, 16, nb, ...]: `_lanes` undone."""
    return np.moveaxis(a, -1, 1)


def _unhalves(h: np.ndarray) -> np.ndarray:
    """[G, nb, 16, 2] -> [G, 16, nb, 2]: `_halves` undone."""
    return h.transpose(0, 2, 1, 3)


def _unquads(q: np.ndarray) -> np.ndarray:
    """[G, nb, Q, 16, 4] -> [G, 16, nb, 4 * Q]: `_quads` undone."""
    g, nb, n, rows, _ = q.shape
    return q.transpose(0, 3, 1, 2, 4).reshape(g, rows, nb, 4 * n)


def _unfifth_bits(masks: np.ndarray) -> np.ndarray:
    """[G, nb, 8, 8] -> Q5_0's qh bytes [G, 16, nb, 4]: `_fifth_bits` undone."""
    g, nb = masks.shape[:2]
    per = np.unpackbits(masks, axis=-1, bitorder="little").reshape(g, nb, 2, 4, ROWS, 4)  # [G, nb, h, k, r, t]
    bits = per.transpose(0, 4, 1, 2, 3, 5).reshape(g, ROWS, nb, 32)  # [G, 16, nb, 32]: bit p of row r
    return np.packbits(bits, axis=-1, bitorder="little")


def _q4k_scale_bytes(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Q4_K's unpacked 6-bit scales and mins [..., 8] each -> its 12 packed bytes [..., 12] (ggml's layout: j < 4
    in the low 6 bits of bytes j and j + 4; j >= 4 in the nibbles of byte j + 4 and the top 2 bits of j - 4, j)."""
    lo, hi = slice(0, 4), slice(4, 8)
    top = np.concatenate([sc[..., lo] | ((sc[..., hi] >> 4) << 6), mn[..., lo] | ((mn[..., hi] >> 4) << 6)], axis=-1)
    return np.concatenate([top, (sc[..., hi] & 15) | ((mn[..., hi] & 15) << 4)], axis=-1).astype(np.uint8)


def _q6k_bytes(q: np.ndarray) -> np.ndarray:
    """Stored quants (0..63) in natural order [..., 256] -> Q6_K's ql [..., 128] and qh [..., 64] bytes:
    `q6k_quants` undone."""
    ql = np.zeros((*q.shape[:-1], 128), dtype=np.uint8)
    qh = np.zeros((*q.shape[:-1], 64), dtype=np.uint8)
    for h in range(2):
        for part in range(4):  # weights 128h + 32 part + (0..31)
            w = q[..., 128 * h + 32 * part : 128 * h + 32 * part + 32]
            low = slice(64 * h + 32 * (part % 2), 64 * h + 32 * (part % 2) + 32)
            ql[..., low] |= (w & 15) << (4 * (part // 2))
            qh[..., 32 * h : 32 * h + 32] |= (w >> 4) << (2 * part)
    return np.concatenate([ql, qh], axis=-1)


def ungroup_rows(groups: torch.Tensor, qtype: Q, out: int) -> torch.Tensor:
    """`group_rows` undone: [groups, nb * GROUP_BYTES] -> the GGUF blocks [out, bytes_per_row] uint8, bit for bit
    the rows it was given (a fast model keeps only its groups; row subsets and `dequantized` come from here)."""
    if qtype not in GROUP_BYTES:
        raise ValueError(f"ungroup_rows takes {', '.join(t.name for t in GROUP_BYTES)}, not {qtype.name}")
    g = groups.shape[0]
    flat = groups.numpy().reshape(g, -1, GROUP_BYTES[qtype])  # [G, nb, GROUP_BYTES]
    nb = flat.shape[1]

    def take(n: int) -> np.ndarray:  # the next n bytes of every group's block
        nonlocal flat
        part, flat = flat[..., :n], flat[..., n:]
        return part

    if qtype == Q.Q4_K:
        d, dmin = _unhalves(take(32).reshape(g, nb, 16, 2)), _unhalves(take(32).reshape(g, nb, 16, 2))
        sc, mn = (_unlanes(take(128).reshape(g, nb, 8, 16)) for _ in range(2))
        parts = [d, dmin, _q4k_scale_bytes(sc, mn), _unquads(take(2048).reshape(g, nb, 32, 16, 4))]
    elif qtype == Q.Q6_K:
        d, sc = _unhalves(take(32).reshape(g, nb, 16, 2)), _unlanes(take(256).reshape(g, nb, 16, 16))
        parts = [_q6k_bytes(_unquads(_q6k_join(take(3072).reshape(g, nb, 8, 384)))), sc, d]
    elif qtype == Q.Q8_0:
        parts = [_unhalves(take(32).reshape(g, nb, 16, 2)), _unquads(take(512).reshape(g, nb, 8, 16, 4))]
    elif qtype == Q.Q5_0:
        d, qs = _unhalves(take(32).reshape(g, nb, 16, 2)), _unquads(take(256).reshape(g, nb, 4, 16, 4))
        parts = [d, _unfifth_bits(take(64).reshape(g, nb, 8, 8)), qs]
    elif qtype == Q.Q4_1:
        d, m = _unhalves(take(32).reshape(g, nb, 16, 2)), _unhalves(take(32).reshape(g, nb, 16, 2))
        parts = [d, m, _unquads(take(256).reshape(g, nb, 4, 16, 4))]
    else:  # Q4_0
        parts = [_unhalves(take(32).reshape(g, nb, 16, 2)), _unquads(take(256).reshape(g, nb, 4, 16, 4))]
    rows = np.concatenate(parts, axis=-1).reshape(g * ROWS, -1)[:out]  # [out, nb * type_bytes]
    return torch.from_numpy(np.ascontiguousarray(rows))
