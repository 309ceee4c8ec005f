/* Fused selection kernels for Gaia and DGC on the CPU (issue 12, docs/performance.md "Kernels").

   NumPy needs one pass per elementwise operation (|w|, x T, |v|, >, count, flatnonzero), and
   np.flatnonzero at a random 2-50% density is branch-bound; one C loop reads each input once
   and compacts the selected entries without a data-dependent branch. Every function computes
   exactly the float32 operations of the NumPy path it replaces (geodml.algorithms.gaia /
   geodml.algorithms.dgc), so results are bit-identical, signed zeros included
   (tests/test_kernels.py compares them).

   Arrays arrive as writable/readable Python buffers (numpy arrays, contiguous, of the stated
   element type); the callers check shapes and types, these functions check sizes only. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static int get(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd-byte elements", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Comparison of 64 consecutive entries at a time into one bit word (bit k: entry base + k).
   SSE2 (every x86-64) compares four floats per instruction; elsewhere a scalar loop. Both use
   IEEE single-precision multiply and compare, so they agree with NumPy bit for bit (NaN
   compares false in all of them). */
#if defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

/* bit k of the result: |v[k]| > |w[k]| * t (gt = 1) or |v[k]| >= t (gt = 0, w unused), k < len <= 64 */
static inline uint64_t word_bits(const float *v, const float *w, float t, int gt, Py_ssize_t len) {
    uint64_t m = 0;
    Py_ssize_t k = 0;
#ifdef HAVE_SSE2
    const __m128 sign = _mm_set1_ps(-0.0f), tv = _mm_set1_ps(t);
    for (; k + 4 <= len; k += 4) {
        const __m128 a = _mm_andnot_ps(sign, _mm_loadu_ps(v + k));
        __m128 c;
        if (gt)
            c = _mm_cmpgt_ps(a, _mm_mul_ps(_mm_andnot_ps(sign, _mm_loadu_ps(w + k)), tv));
        else
            c = _mm_cmpge_ps(a, tv);
        m |= (uint64_t)_mm_movemask_ps(c) << k;
    }
#endif
    for (; k < len; k++)
        m |= (uint64_t)(gt ? (fabsf(v[k]) > fabsf(w[k]) * t) : (fabsf(v[k]) >= t)) << k;
    return m;
}

/* gaia_select(v, w, threshold, vals, idx32) -> (n, dense)

   Gaia, Quagmire Algorithm 1 lines 9-11: entry j is significant when |v_j| > fl32(|w_j| * T)
   with T = fl32(threshold). Sparse result (2n <= N): vals[:n] = v at the significant entries
   in index order, idx32[:n] = their indices, v cleared (+0) there. Dense result (2n > N, a
   dense send is cheaper): vals[j] = v_j * S_j and v_j = v_j - vals[j] for every j, as the
   NumPy path computes them (so unselected negative entries give vals = -0.0, an unselected -0
   in v becomes +0, selected ones leave v = +0).

   The sparse case (the common one) is one pass over v and w, 64 entries at a time; the dense
   case (early in training) costs about two more. */
static PyObject *gaia_select(PyObject *self, PyObject *args) {
    PyObject *ov, *ow, *ovals, *oidx;
    double threshold;
    if (!PyArg_ParseTuple(args, "OOdOO", &ov, &ow, &threshold, &ovals, &oidx))
        return NULL;
    Py_buffer bv, bw, bvals, bidx;
    if (get(ov, &bv, 1, 4, "v") < 0) return NULL;
    if (get(ow, &bw, 0, 4, "w") < 0) { PyBuffer_Release(&bv); return NULL; }
    if (get(ovals, &bvals, 1, 4, "vals") < 0) { PyBuffer_Release(&bv); PyBuffer_Release(&bw); return NULL; }
    if (get(oidx, &bidx, 1, 4, "idx32") < 0) {
        PyBuffer_Release(&bv); PyBuffer_Release(&bw); PyBuffer_Release(&bvals); return NULL;
    }
    Py_ssize_t numel = bv.len / 4, nwords = (bv.len / 4 + 63) / 64;
    PyObject *result = NULL;
    if (bw.len / 4 != numel || bvals.len / 4 < numel || bidx.len / 4 < numel || numel >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "gaia_select: v and w must have N elements, vals and idx32 at least N (< 2**31)");
        goto done;
    }
    float *v = (float *)bv.buf, *vals = (float *)bvals.buf;
    const float *w = (const float *)bw.buf;
    int32_t *idx = (int32_t *)bidx.buf;
    const float t = (float)threshold;
    Py_ssize_t n = 0;
    int dense;
    Py_BEGIN_ALLOW_THREADS
    /* One pass, optimistically sparse: each word's significant entries are moved out while the
       word is in L1. Once more than N/2 are significant the result must be dense: put the moved
       values back (exact: the original bits) and run the dense pass instead. */
    dense = 0;
    if (numel >= 4096) {
        /* High density (early in training) makes the optimistic pass expensive: most entries
           are moved out, then back. Estimate the density from 16 runs of 64 entries spread over
           the buffer; above 35%, count first (one cheap pass), then run the right pass only.
           Only the speed depends on this guess, never the result. */
        Py_ssize_t est = 0;
        for (int r = 0; r < 16; r++) {
            const Py_ssize_t base = (numel / 16) * r;
            est += __builtin_popcountll(word_bits(v + base, w + base, t, 1, 64));
        }
        if (20 * est > 7 * 16 * 64) {
            Py_ssize_t total = 0;
            for (Py_ssize_t b = 0; b < nwords; b++) {
                const Py_ssize_t base = b * 64, len = numel - base < 64 ? numel - base : 64;
                total += __builtin_popcountll(word_bits(v + base, w + base, t, 1, len));
            }
            dense = 2 * total > numel;
        }
    }
    for (Py_ssize_t b = 0; b < nwords && !dense; b++) {
        const Py_ssize_t base = b * 64, len = numel - base < 64 ? numel - base : 64;
        uint64_t m = word_bits(v + base, w + base, t, 1, len);
        if (2 * (n + __builtin_popcountll(m)) > numel) {
            dense = 1;
            break;
        }
        for (; m; m &= m - 1) {
            const Py_ssize_t j = base + __builtin_ctzll(m);
            idx[n] = (int32_t)j;
            vals[n] = v[j];
            v[j] = 0.0f;
            n++;
        }
    }
    if (dense) {
        for (Py_ssize_t i = 0; i < n; i++)
            v[idx[i]] = vals[i];
        n = 0;
        Py_ssize_t j = 0;
#ifdef HAVE_SSE2
        const __m128 sign = _mm_set1_ps(-0.0f), tv = _mm_set1_ps(t), zero = _mm_setzero_ps();
        for (; j + 4 <= numel; j += 4) {
            const __m128 x = _mm_loadu_ps(v + j);
            const __m128 s = _mm_cmpgt_ps(_mm_andnot_ps(sign, x),
                                          _mm_mul_ps(_mm_andnot_ps(sign, _mm_loadu_ps(w + j)), tv));
            const __m128 val = _mm_or_ps(_mm_and_ps(s, x), _mm_andnot_ps(s, _mm_mul_ps(x, zero)));  /* v * S */
            _mm_storeu_ps(vals + j, val);
            _mm_storeu_ps(v + j, _mm_sub_ps(x, val));                                               /* v - v*S */
            n += __builtin_popcount(_mm_movemask_ps(s));
        }
#endif
        for (; j < numel; j++) {
            const float x = v[j];
            const int sel = fabsf(x) > fabsf(w[j]) * t;
            const float val = sel ? x : x * 0.0f;
            vals[j] = val;
            v[j] = x - val;
            n += sel;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(nO)", n, dense ? Py_True : Py_False);
done:
    PyBuffer_Release(&bv); PyBuffer_Release(&bw); PyBuffer_Release(&bvals); PyBuffer_Release(&bidx);
    return result;
}

/* abs_ge_indices(v, threshold, out_idx64) -> c

   DGC's candidate scan: out_idx64[:c] = the indices j, ascending, with |v_j| >= fl32(threshold)
   (the NumPy path: np.greater_equal(|v|, thr) then np.flatnonzero). Reads v once; needs no |v|
   buffer and no mask. */
static PyObject *abs_ge_indices(PyObject *self, PyObject *args) {
    PyObject *ov, *oidx;
    double threshold;
    if (!PyArg_ParseTuple(args, "OdO", &ov, &threshold, &oidx))
        return NULL;
    Py_buffer bv, bidx;
    if (get(ov, &bv, 0, 4, "v") < 0) return NULL;
    if (get(oidx, &bidx, 1, 8, "out") < 0) { PyBuffer_Release(&bv); return NULL; }
    Py_ssize_t numel = bv.len / 4;
    PyObject *result = NULL;
    if (bidx.len / 8 < numel) {
        PyErr_SetString(PyExc_ValueError, "abs_ge_indices: out must hold at least N int64");
        goto done;
    }
    const float *v = (const float *)bv.buf;
    int64_t *idx = (int64_t *)bidx.buf;
    const float t = (float)threshold;
    Py_ssize_t c = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t base = 0; base < numel; base += 64) {
        const Py_ssize_t len = numel - base < 64 ? numel - base : 64;
        for (uint64_t m = word_bits(v + base, NULL, t, 0, len); m; m &= m - 1)
            idx[c++] = base + __builtin_ctzll(m);
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(c);
done:
    PyBuffer_Release(&bv); PyBuffer_Release(&bidx);
    return result;
}

/* max_pool2d(x, out, indices, kH, kW, sH, sW) -> None

   torch.nn.functional.max_pool2d's CPU forward for a contiguous NCHW float32 input without
   padding or dilation (floor or ceil mode: the caller sizes out), for the pools of cnn, lenet
   and cifar-cnn. x is [planes, H, W], out and indices (int64, index into the plane, or None to
   skip them) [planes, OH, OW]. A window starts at (oh sH, ow sW) and is clipped at the input's
   edge. It is torch's own rule (aten/src/ATen/native/cpu/MaxPoolKernel.cpp): scan the window
   row by row, start from -inf at the window's first pixel and take a pixel when it is greater
   than the running maximum or NaN; so the values and the indices (hence the backward pass,
   which torch computes from them) are the same bit for bit (tests/test_compiled_layers.py). torch's
   loop takes a data-dependent branch per pixel, which mispredicts about half the time on ReLU
   outputs (half zeros); this one selects without branching, about 5-15x faster on one core
   (docs/performance.md, "Max-pooling"). */
/* one candidate pixel: take it when it is greater than the running maximum or NaN, with masks
   rather than a branch (a compiler may turn a ternary back into a branch) */
static inline void pool_take(float v, int64_t i, float *m, int64_t *mi) {
    uint32_t vb, mb;
    memcpy(&vb, &v, 4); memcpy(&mb, m, 4);
    const uint32_t take = (uint32_t)0 - (uint32_t)((v > *m) | (v != v));
    mb = (mb & ~take) | (vb & take);
    memcpy(m, &mb, 4);
    const int64_t take64 = (int64_t)(int32_t)take;
    *mi = (*mi & ~take64) | (i & take64);
}

static inline void pool_one(const float *x, float *out, int64_t *ind, Py_ssize_t W, Py_ssize_t ih0, Py_ssize_t ih1,
                            Py_ssize_t iw0, Py_ssize_t iw1, Py_ssize_t o) {
    float m = -INFINITY;
    int64_t mi = ih0 * W + iw0;
    for (Py_ssize_t ih = ih0; ih < ih1; ih++)
        for (Py_ssize_t iw = iw0; iw < iw1; iw++)
            pool_take(x[ih * W + iw], ih * W + iw, &m, &mi);
    out[o] = m;
    if (ind) ind[o] = mi;
}

#ifdef HAVE_SSE2
/* pool_one for the stride-2 outputs ow .. ow + 3 of one row (their windows inside the row), in
   SSE2 lanes: the candidates in the same order, the same take rule on vectors */
static inline void pool_four(const float *x, float *out, int64_t *ind, Py_ssize_t W, Py_ssize_t ih0, Py_ssize_t ih1,
                             Py_ssize_t kW, Py_ssize_t o, Py_ssize_t ow) {
    const __m128i lane = _mm_set_epi32(6, 4, 2, 0);
    __m128 m = _mm_set1_ps(-INFINITY);
    __m128i mi = _mm_add_epi32(_mm_set1_epi32((int)(ih0 * W + 2 * ow)), lane);
    for (Py_ssize_t ih = ih0; ih < ih1; ih++)
        for (Py_ssize_t dw = 0; dw < kW; dw++) {
            const float *p = x + ih * W + 2 * ow + dw;  /* p[0], p[2], p[4], p[6] */
            const __m128 a = _mm_loadu_ps(p), b = _mm_loadu_ps(p + 3);
            const __m128 v = _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 2, 0));
            const __m128i i = _mm_add_epi32(_mm_set1_epi32((int)(ih * W + 2 * ow + dw)), lane);
            const __m128 take = _mm_or_ps(_mm_cmpgt_ps(v, m), _mm_cmpunord_ps(v, v));
            const __m128i takei = _mm_castps_si128(take);
            m = _mm_or_ps(_mm_andnot_ps(take, m), _mm_and_ps(take, v));
            mi = _mm_or_si128(_mm_andnot_si128(takei, mi), _mm_and_si128(takei, i));
        }
    _mm_storeu_ps(out + o, m);
    if (ind) {
        const __m128i zero = _mm_setzero_si128();
        _mm_storeu_si128((__m128i *)(ind + o), _mm_unpacklo_epi32(mi, zero));
        _mm_storeu_si128((__m128i *)(ind + o + 2), _mm_unpackhi_epi32(mi, zero));
    }
}
#endif

static inline void pool_plane(const float *x, float *out, int64_t *ind, Py_ssize_t H, Py_ssize_t W,
                              Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t kH, Py_ssize_t kW,
                              Py_ssize_t sH, Py_ssize_t sW) {
    for (Py_ssize_t oh = 0; oh < OH; oh++) {
        const Py_ssize_t ih0 = oh * sH, ih1 = ih0 + kH < H ? ih0 + kH : H;
        Py_ssize_t ow = 0;
#ifdef HAVE_SSE2
        /* stride 2: four neighbouring outputs at once while their windows lie inside the row
           (2 (ow + 3) + kW <= W), then one more group that ends at the last such output
           (recomputing a few, with the same result) */
        if (sW == 2 && 6 + kW <= W) {
            for (; 2 * ow + 6 + kW <= W; ow += 4) pool_four(x, out, ind, W, ih0, ih1, kW, oh * OW + ow, ow);
            const Py_ssize_t last = (W - 6 - kW) / 2;
            if (ow < OW && last + 3 >= ow) { pool_four(x, out, ind, W, ih0, ih1, kW, oh * OW + last, last); ow = last + 4; }
        }
#endif
        for (; ow < OW; ow++) {
            const Py_ssize_t iw0 = ow * sW, iw1 = iw0 + kW < W ? iw0 + kW : W;
            pool_one(x, out, ind, W, ih0, ih1, iw0, iw1, oh * OW + ow);
        }
    }
}

static PyObject *max_pool2d(PyObject *self, PyObject *args) {
    PyObject *ox, *oout, *oind;
    Py_ssize_t kH, kW, sH, sW;
    if (!PyArg_ParseTuple(args, "OOOnnnn", &ox, &oout, &oind, &kH, &kW, &sH, &sW))
        return NULL;
    Py_buffer bx, bout, bind;
    int has_ind = oind != Py_None;
    if (get(ox, &bx, 0, 4, "x") < 0) return NULL;
    if (get(oout, &bout, 1, 4, "out") < 0) { PyBuffer_Release(&bx); return NULL; }
    if (has_ind && get(oind, &bind, 1, 8, "indices") < 0) {
        PyBuffer_Release(&bx); PyBuffer_Release(&bout); return NULL;
    }
    PyObject *result = NULL;
    if (bx.ndim != 3 || bout.ndim != 3 || bx.shape[0] != bout.shape[0]
        || (has_ind && (bind.ndim != 3 || bind.shape[0] != bout.shape[0] || bind.shape[1] != bout.shape[1]
                        || bind.shape[2] != bout.shape[2]))) {
        PyErr_SetString(PyExc_ValueError, "max_pool2d: x must be [planes, H, W], out and indices [planes, OH, OW]");
        goto done;
    }
    const Py_ssize_t P = bx.shape[0], H = bx.shape[1], W = bx.shape[2], OH = bout.shape[1], OW = bout.shape[2];
    if (H * W > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "max_pool2d: a plane must have fewer than 2^31 pixels");
        goto done;
    }
    if (kH < 1 || kW < 1 || sH < 1 || sW < 1 || (OH > 0 && (OH - 1) * sH >= H) || (OW > 0 && (OW - 1) * sW >= W)) {
        PyErr_SetString(PyExc_ValueError, "max_pool2d: every window must start inside the input");
        goto done;
    }
    const float *x = (const float *)bx.buf;
    float *out = (float *)bout.buf;
    int64_t *ind = has_ind ? (int64_t *)bind.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < P; p++) {
        const float *xp = x + p * H * W;
        float *op = out + p * OH * OW;
        int64_t *ip = ind ? ind + p * OH * OW : NULL;
        /* the models' pools, with constant window sizes so the compiler unrolls the scan */
        if (kH == 2 && kW == 2 && sH == 2 && sW == 2) pool_plane(xp, op, ip, H, W, OH, OW, 2, 2, 2, 2);
        else if (kH == 3 && kW == 3 && sH == 2 && sW == 2) pool_plane(xp, op, ip, H, W, OH, OW, 3, 3, 2, 2);
        else pool_plane(xp, op, ip, H, W, OH, OW, kH, kW, sH, sW);
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&bx); PyBuffer_Release(&bout);
    if (has_ind) PyBuffer_Release(&bind);
    return result;
}

/* lrn_mean(x, out, size) -> None and lrn_mean_backward(grad, grad_in, size) -> None

   The channel-window mean inside torch's local_response_norm (torch.nn.functional): the squared
   input, zero-padded with size // 2 channels before and (size - 1) // 2 after, average-pooled
   over `size` channels with stride 1 (avg_pool3d with a (size, 1, 1) window). x, out, grad and
   grad_in are [N, C, L] float32 (L = H x W). Forward: out[c] = (sum of the window's channels,
   ascending, from 0) / size, as avg_pool3d's CPU loop computes it per output (the padded zeros
   are skipped: adding +0.0 to a sum that starts at +0.0 changes no bit). Backward, as
   avg_pool3d's backward: each output's grad / size is added to every channel of its window,
   outputs in ascending order, into a zeroed grad_in. Both loop over L innermost, which the
   compiler vectorizes without reordering any one element's additions; torch's avg_pool3d CPU
   kernel for this shape ran several times slower (docs/performance.md, "LRN"). Bit-identical to
   torch (tests/test_compiled_layers.py), NaN payloads included: the backward adds as
   row + grad_in (with grad_in + row, gcc's SSE code kept the other NaN's sign bit when both were
   NaN), which the test's NaN inputs check. */
static int lrn_views(PyObject *oa, PyObject *ob, Py_buffer *ba, Py_buffer *bb, Py_ssize_t size, const char *name) {
    if (get(oa, ba, 0, 4, "input") < 0) return -1;
    if (get(ob, bb, 1, 4, "output") < 0) { PyBuffer_Release(ba); return -1; }
    if (ba->ndim != 3 || bb->ndim != 3 || ba->shape[0] != bb->shape[0] || ba->shape[1] != bb->shape[1]
        || ba->shape[2] != bb->shape[2] || size < 1) {
        PyErr_Format(PyExc_ValueError, "%s: input and output must be [N, C, L] of one shape, size >= 1", name);
        PyBuffer_Release(ba); PyBuffer_Release(bb);
        return -1;
    }
    return 0;
}

static PyObject *lrn_mean(PyObject *self, PyObject *args) {
    PyObject *ox, *oout;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OOn", &ox, &oout, &size)) return NULL;
    Py_buffer bx, bout;
    if (lrn_views(ox, oout, &bx, &bout, size, "lrn_mean") < 0) return NULL;
    const Py_ssize_t N = bx.shape[0], C = bx.shape[1], L = bx.shape[2], before = size / 2;
    const float *x = (const float *)bx.buf;
    float *out = (float *)bout.buf;
    const float div = (float)size;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t n = 0; n < N; n++)
        for (Py_ssize_t c = 0; c < C; c++) {
            float *o = out + (n * C + c) * L;
            const Py_ssize_t c0 = c - before < 0 ? 0 : c - before;
            const Py_ssize_t c1 = c - before + size > C ? C : c - before + size;
            for (Py_ssize_t j = 0; j < L; j++) o[j] = 0.0f;
            for (Py_ssize_t k = c0; k < c1; k++) {
                const float *xk = x + (n * C + k) * L;
                for (Py_ssize_t j = 0; j < L; j++) o[j] += xk[j];
            }
            for (Py_ssize_t j = 0; j < L; j++) o[j] = o[j] / div;
        }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bx); PyBuffer_Release(&bout);
    Py_RETURN_NONE;
}

static PyObject *lrn_mean_backward(PyObject *self, PyObject *args) {
    PyObject *og, *ogin;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OOn", &og, &ogin, &size)) return NULL;
    Py_buffer bg, bgin;
    if (lrn_views(og, ogin, &bg, &bgin, size, "lrn_mean_backward") < 0) return NULL;
    const Py_ssize_t N = bg.shape[0], C = bg.shape[1], L = bg.shape[2], before = size / 2;
    const float *g = (const float *)bg.buf;
    float *gin = (float *)bgin.buf;
    const float div = (float)size;
    float *row = PyMem_Malloc((L > 0 ? L : 1) * sizeof(float));
    if (row == NULL) { PyBuffer_Release(&bg); PyBuffer_Release(&bgin); return PyErr_NoMemory(); }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < N * C * L; i++) gin[i] = 0.0f;
    for (Py_ssize_t n = 0; n < N; n++)
        for (Py_ssize_t c = 0; c < C; c++) {       /* output c's window: channels c - before .. c - before + size - 1 */
            const float *gc = g + (n * C + c) * L;
            for (Py_ssize_t j = 0; j < L; j++) row[j] = gc[j] / div;
            const Py_ssize_t c0 = c - before < 0 ? 0 : c - before;
            const Py_ssize_t c1 = c - before + size > C ? C : c - before + size;
            for (Py_ssize_t k = c0; k < c1; k++) {
                float *gk = gin + (n * C + k) * L;
                for (Py_ssize_t j = 0; j < L; j++) gk[j] = row[j] + gk[j];
            }
        }
    Py_END_ALLOW_THREADS
    PyMem_Free(row);
    PyBuffer_Release(&bg); PyBuffer_Release(&bgin);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gaia_select", gaia_select, METH_VARARGS, "Gaia's fused significance selection (see geodml/_kernels.c)."},
    {"abs_ge_indices", abs_ge_indices, METH_VARARGS, "Indices with |v| >= threshold (see geodml/_kernels.c)."},
    {"lrn_mean", lrn_mean, METH_VARARGS, "local_response_norm's channel-window mean, forward (see geodml/_kernels.c)."},
    {"lrn_mean_backward", lrn_mean_backward, METH_VARARGS, "Its backward (see geodml/_kernels.c)."},
    {"max_pool2d", max_pool2d, METH_VARARGS, "max_pool2d's CPU forward, NCHW float32, branch-free (see geodml/_kernels.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "geodml._kernels",
                                    "Fused CPU selection kernels for Gaia and DGC (geodml/_kernels.c).", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
