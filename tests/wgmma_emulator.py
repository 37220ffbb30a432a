"""A numpy emulator of what a warpgroup's wgmma computes for one bench/probes/wgmma_probe.py record,
written from the PTX ISA's rules (9.7.15.5 fragments and shared-memory layouts, 9.7.15.5.1
matrix descriptor, 9.7.15.6 sparse metadata) independently of wgmma_layout.py, so the records
the probe sends can be checked without a GPU.  Numpy only (the fake GPU of
tests/test_wgmma_layout.py runs it in a subprocess)."""
from __future__ import annotations

import numpy as np


def _halves(img, addr, dtype):
    bits = img[addr].astype(np.uint16) | (img[addr + 1].astype(np.uint16) << 8)
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _read_operand(img, desc, rows, kelems, dtype):
    """A K-major operand as wgmma would read it (9.7.15.5.1): fields from the descriptor,
    core matrices of 8 rows x 16 bytes, 128-byte swizzle on the address bits."""
    start, lbo = (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4
    sbo, swz = ((desc >> 32) & 0x3FFF) << 4, desc >> 62
    r, k = np.meshgrid(np.arange(rows), np.arange(kelems), indexing="ij")
    if swz == 0:
        addr = start + (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2
    else:
        assert swz == 1
        addr = start + (r // 8) * sbo + (r % 8) * 128 + 2 * k
        addr = addr ^ (((addr >> 7) & 7) << 4)
    inside = addr + 1 < img.size      # past the image: zeros (a what-if may read there)
    return np.where(inside, _halves(img, np.where(inside, addr, 0), dtype), 0.0)


def emulate(rec, dtype):
    """What the warpgroup computes for one probe record (image base address 0)."""
    n, v = int(rec["n"]), int(rec["variant"])
    sparse, areg, sel = bool(v & 4), bool(v & 2), (v >> 3) & 1
    tid = np.arange(128)
    w, g, t = tid // 32, (tid % 32) // 4, tid % 4
    i = np.arange(n // 2)
    d_rows = 16 * w[:, None] + g[:, None] + 8 * ((i[None] // 2) % 2)
    d_cols = 8 * (i[None] // 4) + 2 * t[:, None] + i[None] % 2
    d = np.zeros((64, n))
    d[d_rows, d_cols] = rec["c"][:, : n // 2]
    if not rec["scale_d"]:
        d[:] = 0
    kb = 32 if sparse else 16
    for s in range(int(rec["nsteps"])):
        if areg:
            regs = rec["a_regs"][s]
            a = np.zeros((64, 16))
            for j in range(4):
                for half in range(2):
                    bits = ((regs[:, j] >> (16 * half)) & 0xFFFF).astype(np.uint16)
                    vals = (bits.view(np.float16).astype(np.float64) if dtype == "f16" else
                            (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64))
                    a[16 * w + g + 8 * (j % 2), 2 * t + 8 * (j // 2) + half] = vals
        else:
            a = _read_operand(rec["smem"], int(rec["desc_a"]) + (int(rec["a_off"][s]) >> 4),
                              64, 16, dtype)
        b = _read_operand(rec["smem"], int(rec["desc_b"]) + (int(rec["b_off"][s]) >> 4),
                          n, kb, dtype).T
        if sparse:   # lane 4g + 2 sel + h of warp w: rows 16w+g (bits 0-15), +8 (16-31)
            dense = np.zeros((64, 32))
            meta = rec["meta"][s].astype(np.int64)
            r, grp = np.arange(64)[:, None], np.arange(8)[None, :]
            th = 32 * (r // 16) + 4 * (r % 8) + 2 * sel + grp // 4
            sh = 16 * ((r // 8) % 2) + 4 * (grp % 4)
            i0, i1 = (meta[th] >> sh) & 3, (meta[th] >> (sh + 2)) & 3
            dense[r, 4 * grp + i0] = a[r, 2 * grp]
            dense[r, 4 * grp + i1] = a[r, 2 * grp + 1]
            a = dense
        d = d + a @ b
    out = np.zeros((128, 128), dtype=np.float32)
    out[:, : n // 2] = d[d_rows, d_cols]
    return out


def swap_lbo_sbo(rec):
    """Rewrite a record as a GPU that read LBO as SBO and back would see it."""
    for key in ("desc_a", "desc_b"):   # a GPU that read LBO as SBO and back (no swizzle)
        dsc = int(rec[key])
        if dsc >> 62:
            continue
        lbo, sbo = (dsc >> 16) & 0x3FFF, (dsc >> 32) & 0x3FFF
        rec[key] = (dsc & ~((0x3FFF << 16) | (0x3FFF << 32))) | (sbo << 16) | (lbo << 32)
