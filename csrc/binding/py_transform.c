/* py_transform.c: Python binding of the transform core (imgops.h).
 *
 * Module-level functions for tests and benchmarks (fastloader/ itself does
 * not call them, hence the underscore), registered by fl_register_transform:
 *   _plan_sample(spec, src_w, src_h, seed=0, epoch=0, index=0) -> dict
 *       dict(box=(x, y, w, h), resized=(w, h), window=(x, y), flip=bool, vflip=bool, gray=bool, out=(w, h),
 *            interp=0 bilinear | 1 bicubic, aug=[...], erase=None | [(x, y, w, h), ...], erase_key, mix,
 *            affine, blur=None | sigma)
 *   _render(spec, image, plan=None, seed=0, epoch=0, index=0, *,
 *           view_scale=(1.0, 1.0), view_origin=(0.0, 0.0), src_size=None) -> ndarray
 *       image: uint8 [H, W] or [H, W, 1|3], the decoded buffer.  view_scale /
 *       view_origin describe it as a DCT-scaled / region-decoded view of a
 *       src_size (w, h) source (default: image size / view_scale).  The
 *       plan (a _plan_sample dict) is drawn from (seed, epoch, index) when None.
 *       Output: [C, H, W] (CHW) or [H, W, C] (HWC) of the spec's dtype;
 *       float16 as numpy float16, bfloat16 as uint16 raw bits.
 * Plus fl_tspec_from_pydict (py_transform.h) for the engine binding.
 *
 * All functions run with the GIL held; it is released only around
 * fl_render, while this call holds references to the input and output
 * arrays.  The scratch is plain malloc memory (no GIL needed to free).
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include <numpy/arrayobject.h>

#include <dlfcn.h>
#include <string.h>

#include "image/augment.h"
#include "image/imgops.h"
#include "binding/py_transform.h"

/* ------------------------------------------------------------------------ */
/* spec dict -> fl_tspec                                                    */

/* key -> int (bools accepted).  Returns 0 or -1 with ValueError/TypeError. */
static int
fl_get_int(PyObject *v, const char *key, int *out)
{
    int overflow = 0;
    long x;
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "transform spec: '%s' must be an int, not %.100s", key, Py_TYPE(v)->tp_name);
        return -1;
    }
    x = PyLong_AsLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (overflow || x < INT_MIN || x > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "transform spec: '%s' is out of range", key);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int
fl_get_double(PyObject *v, const char *key, double *out)
{
    double x = PyFloat_AsDouble(v);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "transform spec: '%s' must be a number, not %.100s", key,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    *out = x;
    return 0;
}

/* key -> index of v in names[] (strings).  Returns 0 or -1 with ValueError. */
static int
fl_get_choice(PyObject *v, const char *key, const char *const *names, int n, int *out)
{
    const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
    if (s == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "transform spec: '%s' must be a string", key);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "transform spec: '%s' has an unknown value '%s'", key, s);
    return -1;
}

/* key -> 1 or 3 floats.  Returns the count, or -1 with an exception. */
static int
fl_get_floats3(PyObject *v, const char *key, float out[3])
{
    PyObject *seq = PySequence_Fast(v, "");
    if (seq == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "transform spec: '%s' must be a sequence of floats", key);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != 1 && n != 3) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "transform spec: '%s' needs 1 or 3 values, not %zd", key, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        double x;
        if (fl_get_double(PySequence_Fast_GET_ITEM(seq, i), key, &x) < 0) {
            Py_DECREF(seq);
            return -1;
        }
        out[i] = (float)x;   /* torch.as_tensor(mean, dtype=float32) */
    }
    Py_DECREF(seq);
    if (n == 1)
        out[1] = out[2] = out[0];
    return (int)n;
}

/* timm's AugmentOps, ops = [(op code, level, prob, m, mstd, mmax, hparam), ...],
 * into P->timm / P->ntimm (at most max).  Returns 0 or -1 with ValueError. */
static int
fl_timm_ops_from_py(PyObject *ops, int max, fl_policy *P)
{
    PyObject *seq = PySequence_Fast(ops, "transform spec: 'policy.ops' must be a sequence");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > max) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "transform spec: 'policy.ops' has %zd ops, not 1..%d", n, max);
        return -1;
    }
    P->ntimm = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        fl_timm_op *o = &P->timm[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiddddd", &o->op, &o->level, &o->prob, &o->m,
                              &o->mstd, &o->mmax, &o->hparam)) {
            Py_DECREF(seq);
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "transform spec: 'policy.ops[%zd]' must be (op, level, prob, m, mstd, mmax, hparam)", i);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* The timm half of fl_policy_from_pydict (kind "timm_ra", "timm_aa" or "timm_augmix"):
 *   rounds: int, interp: int (augment.h, FL_AUG_RANDOM allowed), fill: 3 ints,
 *   ops: the AugmentOps (fl_timm_ops_from_py);
 *   timm_ra: weights: None or one float per op;
 *   timm_aa: subs: [[op index, ...], ...], the sub-policies.
 * P is zeroed but for kind.  Returns 0 or -1 with TypeError/ValueError. */
static int
fl_timm_policy_from_pydict(PyObject *rounds, PyObject *interp, PyObject *fill, PyObject *ops, PyObject *weights,
                           PyObject *subs, fl_policy *P)
{
    const int aa = P->kind == FL_POLICY_TIMM_AA;
    if (rounds == NULL || ops == NULL || interp == NULL || fill == NULL || (aa && subs == NULL)) {
        PyErr_SetString(PyExc_ValueError,
                        "transform spec: a timm 'policy' needs 'rounds', 'interp', 'fill', 'ops' (and 'subs')");
        return -1;
    }
    if (fl_get_int(rounds, "policy.rounds", &P->rounds) < 0 || fl_get_int(interp, "policy.interp", &P->interp) < 0)
        return -1;
    if (!PyArg_ParseTuple(fill, "iii", &P->fill[0], &P->fill[1], &P->fill[2])) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "transform spec: 'policy.fill' must be a tuple of 3 ints");
        return -1;
    }
    if (fl_timm_ops_from_py(ops, aa ? FL_POLICY_MAX_TIMM : FL_POLICY_MAX_OPS, P) < 0)
        return -1;
    if (aa) {
        PyObject *seq = PySequence_Fast(subs, "transform spec: 'policy.subs' must be a sequence");
        if (seq == NULL)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n < 1 || n > FL_POLICY_MAX_SUB) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "transform spec: 'policy.subs' has %zd sub-policies, not 1..%d", n,
                         FL_POLICY_MAX_SUB);
            return -1;
        }
        P->nsub = (int)n;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *steps = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, i), "");
            Py_ssize_t ns = steps ? PySequence_Fast_GET_SIZE(steps) : -1;
            if (ns < 1 || ns > FL_POLICY_MAX_STEPS) {
                Py_XDECREF(steps);
                Py_DECREF(seq);
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "transform spec: 'policy.subs[%zd]' must hold 1..%d op indices", i,
                             FL_POLICY_MAX_STEPS);
                return -1;
            }
            P->sub_len[i] = (int)ns;
            for (Py_ssize_t k = 0; k < ns; k++) {
                if (fl_get_int(PySequence_Fast_GET_ITEM(steps, k), "policy.subs", &P->sub[i][k].op) < 0) {
                    Py_DECREF(steps);
                    Py_DECREF(seq);
                    return -1;
                }
                P->sub[i][k].bin = -1;
                P->sub[i][k].p = 1.0;
            }
            Py_DECREF(steps);
        }
        Py_DECREF(seq);
        return 0;
    }
    P->nops = P->ntimm;
    if (weights == NULL || weights == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(weights, "transform spec: 'policy.weights' must be None or a sequence");
    if (seq == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(seq) != P->nops) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "transform spec: 'policy.weights' needs one weight per op (%d)", P->nops);
        return -1;
    }
    for (int i = 0; i < P->nops; i++) {
        if (fl_get_double(PySequence_Fast_GET_ITEM(seq, i), "policy.weights", &P->weight[i]) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    P->has_weights = 1;
    return 0;
}

/* An AugMix policy's (torchvision's or timm's) "depth" and "alpha" -> P.
 * Returns 0 or -1 with ValueError/TypeError. */
static int
fl_augmix_from_pydict(PyObject *v, fl_policy *P)
{
    PyObject *depth = PyDict_GetItemString(v, "depth"), *alpha = PyDict_GetItemString(v, "alpha");
    if (depth == NULL || alpha == NULL) {
        PyErr_SetString(PyExc_ValueError, "transform spec: an AugMix 'policy' needs 'depth' and 'alpha'");
        return -1;
    }
    if (fl_get_int(depth, "policy.depth", &P->depth) < 0 || fl_get_double(alpha, "policy.alpha", &P->alpha) < 0)
        return -1;
    return 0;
}

/* d["policy"] (a dict) -> t->policy:
 *   kind: "torchvision" (the default), "timm_ra", "timm_aa" or "timm_augmix" (fl_timm_policy_from_pydict;
 *         timm_augmix also takes depth and alpha), "augmix",
 *   rounds: int, interp: int (augment.h), fill: 3 ints,
 *   ops: [(op code, signed, [magnitudes...]), ...],
 *   subs: [[(op index, bin or -1, p), ...], ...]
 * Sizes are bounded here; the values are checked by fl_tspec_check.
 * Returns 0 or -1 with TypeError/ValueError naming the field. */
static int
fl_policy_from_pydict(PyObject *v, fl_policy *P)
{
    PyObject *ops, *subs, *fill = NULL;
    memset(P, 0, sizeof *P);
    if (!PyDict_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "transform spec: 'policy' must be a dict");
        return -1;
    }
    PyObject *rounds = PyDict_GetItemString(v, "rounds"), *interp = PyDict_GetItemString(v, "interp");
    PyObject *kind = PyDict_GetItemString(v, "kind"), *weights = PyDict_GetItemString(v, "weights");
    ops = PyDict_GetItemString(v, "ops");
    subs = PyDict_GetItemString(v, "subs");
    fill = PyDict_GetItemString(v, "fill");
    if (kind != NULL) {
        if (!PyUnicode_Check(kind)) {
            PyErr_SetString(PyExc_TypeError, "transform spec: 'policy.kind' must be a str");
            return -1;
        }
        if (PyUnicode_CompareWithASCIIString(kind, "timm_ra") == 0)
            P->kind = FL_POLICY_TIMM_RA;
        else if (PyUnicode_CompareWithASCIIString(kind, "timm_aa") == 0)
            P->kind = FL_POLICY_TIMM_AA;
        else if (PyUnicode_CompareWithASCIIString(kind, "augmix") == 0)
            P->kind = FL_POLICY_AUGMIX;
        else if (PyUnicode_CompareWithASCIIString(kind, "timm_augmix") == 0)
            P->kind = FL_POLICY_TIMM_AUGMIX;
        else if (PyUnicode_CompareWithASCIIString(kind, "torchvision") != 0) {
            PyErr_Format(PyExc_ValueError,
                         "transform spec: 'policy.kind' %R is not 'torchvision', 'timm_ra', 'timm_aa', 'augmix' or "
                         "'timm_augmix'", kind);
            return -1;
        }
    }
    if (P->kind == FL_POLICY_TIMM_AUGMIX && fl_augmix_from_pydict(v, P) < 0)   /* timm's ops, AugMix's depth, alpha */
        return -1;
    if (P->kind == FL_POLICY_TIMM_RA || P->kind == FL_POLICY_TIMM_AA || P->kind == FL_POLICY_TIMM_AUGMIX)
        return fl_timm_policy_from_pydict(rounds, interp, fill, ops, weights, subs, P);
    const int augmix = P->kind == FL_POLICY_AUGMIX;
    if (rounds == NULL || ops == NULL || (subs == NULL && !augmix)) {
        PyErr_SetString(PyExc_ValueError, augmix ? "transform spec: an AugMix 'policy' needs 'rounds' and 'ops'"
                                                 : "transform spec: 'policy' needs 'rounds', 'ops' and 'subs'");
        return -1;
    }
    if (augmix && fl_augmix_from_pydict(v, P) < 0)
        return -1;
    if (fl_get_int(rounds, "policy.rounds", &P->rounds) < 0)
        return -1;
    if (interp != NULL && fl_get_int(interp, "policy.interp", &P->interp) < 0)
        return -1;
    if (fill != NULL && !PyArg_ParseTuple(fill, "iii", &P->fill[0], &P->fill[1], &P->fill[2])) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "transform spec: 'policy.fill' must be a tuple of 3 ints");
        return -1;
    }
    PyObject *seq = PySequence_Fast(ops, "transform spec: 'policy.ops' must be a sequence");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > FL_POLICY_MAX_OPS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "transform spec: 'policy.ops' has %zd ops, not 1..%d", n, FL_POLICY_MAX_OPS);
        return -1;
    }
    P->nops = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        fl_policy_op *o = &P->ops[i];
        PyObject *mags, *mseq;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ipO", &o->op, &o->is_signed, &mags)
            || (mseq = PySequence_Fast(mags, "")) == NULL) {
            Py_DECREF(seq);
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "transform spec: 'policy.ops[%zd]' must be (op, signed, [magnitudes])", i);
            return -1;
        }
        Py_ssize_t nb = PySequence_Fast_GET_SIZE(mseq);
        if (nb > FL_POLICY_MAX_BINS) {
            Py_DECREF(mseq);
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "transform spec: 'policy.ops[%zd]' has %zd magnitude bins, more than %d", i,
                         nb, FL_POLICY_MAX_BINS);
            return -1;
        }
        o->nbins = (int)nb;
        for (Py_ssize_t b = 0; b < nb; b++) {
            if (fl_get_double(PySequence_Fast_GET_ITEM(mseq, b), "policy.ops magnitude", &o->mag[b]) < 0) {
                Py_DECREF(mseq);
                Py_DECREF(seq);
                return -1;
            }
        }
        Py_DECREF(mseq);
    }
    Py_DECREF(seq);
    if (augmix)
        return 0;
    seq = PySequence_Fast(subs, "transform spec: 'policy.subs' must be a sequence");
    if (seq == NULL)
        return -1;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > FL_POLICY_MAX_SUB) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "transform spec: 'policy.subs' has %zd sub-policies, not 1..%d", n,
                     FL_POLICY_MAX_SUB);
        return -1;
    }
    P->nsub = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *steps = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, i), "");
        Py_ssize_t ns = steps ? PySequence_Fast_GET_SIZE(steps) : -1;
        if (ns < 1 || ns > FL_POLICY_MAX_STEPS) {
            Py_XDECREF(steps);
            Py_DECREF(seq);
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "transform spec: 'policy.subs[%zd]' must hold 1..%d steps", i,
                         FL_POLICY_MAX_STEPS);
            return -1;
        }
        P->sub_len[i] = (int)ns;
        for (Py_ssize_t k = 0; k < ns; k++) {
            fl_policy_step *st = &P->sub[i][k];
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(steps, k), "iid", &st->op, &st->bin, &st->p)) {
                Py_DECREF(steps);
                Py_DECREF(seq);
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "transform spec: 'policy.subs[%zd][%zd]' must be (op index, bin, p)", i,
                             k);
                return -1;
            }
        }
        Py_DECREF(steps);
    }
    Py_DECREF(seq);
    return 0;
}

/* d["erase"] (a dict: p, scale (lo, hi), ratio (lo, hi), mode (0 const, 1
 * random), value: 1 or 3 floats) -> e.  Returns 0 or -1 with an exception. */
static int
fl_erase_from_pydict(PyObject *v, fl_erase *e)
{
    memset(e, 0, sizeof *e);
    if (!PyDict_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "transform spec: 'erase' must be a dict");
        return -1;
    }
    PyObject *p = PyDict_GetItemString(v, "p"), *scale = PyDict_GetItemString(v, "scale"),
             *ratio = PyDict_GetItemString(v, "ratio"), *mode = PyDict_GetItemString(v, "mode"),
             *value = PyDict_GetItemString(v, "value");
    if (p == NULL || scale == NULL || ratio == NULL) {
        PyErr_SetString(PyExc_ValueError, "transform spec: 'erase' needs 'p', 'scale' and 'ratio'");
        return -1;
    }
    if (fl_get_double(p, "erase.p", &e->p) < 0)
        return -1;
    if (!PyArg_ParseTuple(scale, "dd", &e->scale_lo, &e->scale_hi)
        || !PyArg_ParseTuple(ratio, "dd", &e->ratio_lo, &e->ratio_hi)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "transform spec: 'erase.scale' and 'erase.ratio' must be pairs of floats");
        return -1;
    }
    if (mode != NULL && fl_get_int(mode, "erase.mode", &e->mode) < 0)
        return -1;
    PyObject *count = PyDict_GetItemString(v, "count");
    if (count != NULL && !PyArg_ParseTuple(count, "ii", &e->min_count, &e->max_count)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "transform spec: 'erase.count' must be a pair of ints");
        return -1;
    }
    if (value != NULL && fl_get_floats3(value, "erase.value", e->value) < 0)
        return -1;
    return 0;
}

/* The "jitter" dict (p, pos, and any of brightness / contrast / saturation /
 * hue as a (lo, hi) pair of floats) -> J.  Returns 0 or -1 with an
 * exception. */
static int
fl_jitter_from_pydict(PyObject *v, fl_jitter *J)
{
    static const char *const names[4] = {"brightness", "contrast", "saturation", "hue"};
    memset(J, 0, sizeof *J);
    if (!PyDict_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "transform spec: 'jitter' must be a dict");
        return -1;
    }
    PyObject *p = PyDict_GetItemString(v, "p"), *pos = PyDict_GetItemString(v, "pos");
    if (p == NULL || pos == NULL) {
        PyErr_SetString(PyExc_ValueError, "transform spec: 'jitter' needs 'p' and 'pos'");
        return -1;
    }
    if (fl_get_double(p, "jitter.p", &J->p) < 0 || fl_get_int(pos, "jitter.pos", &J->pos) < 0)
        return -1;
    Py_ssize_t known = 2;
    for (int k = 0; k < 4; k++) {
        PyObject *r = PyDict_GetItemString(v, names[k]);
        if (r == NULL)
            continue;
        known++;
        if (!PyArg_ParseTuple(r, "dd", &J->lo[k], &J->hi[k])) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "transform spec: 'jitter.%s' must be a pair of floats", names[k]);
            return -1;
        }
        J->has[k] = 1;
    }
    if (PyDict_Size(v) != known) {
        PyErr_SetString(PyExc_ValueError, "transform spec: 'jitter' has keys other than p, pos, brightness, "
                                          "contrast, saturation and hue");
        return -1;
    }
    return 0;
}

/* torch's exp for GaussianBlur v1 (image/augment.h fl_vexp_fn): torch.exp
 * on a float tensor is ATen's at::vml::vexp, which in torch's MKL builds is
 * MKL's vmsExp(n, in, out, VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE).
 * The one linked into the loaded libtorch_cpu.so is found by its soname
 * (RTLD_NOLOAD: only when torch is already imported; never loaded here)
 * and called as torch calls it.  n is passed as a 64-bit integer, which an
 * LP64 MKL (an int n) and an ILP64 one both read right on x86-64. */
typedef void (*fl_mkl_vms_fn)(long long n, const float *a, float *r, long long mode);
typedef struct {
    fl_mkl_vms_fn fn;   /* set once, under the GIL, before any spec that uses it exists */
} fl_torch_mkl_t;
static fl_torch_mkl_t fl_torch_mkl;

/* fl_vexp_fn over fl_torch_mkl (ctx): no GIL, re-entrant (MKL's VML is). */
static void
fl_torch_mkl_vexp(void *ctx, const float *in, float *out, int n)
{
    const fl_mkl_vms_fn fn = ((const fl_torch_mkl_t *)ctx)->fn;
    fn((long long)n, in, out, 0x2 /* VML_HA */ | 0x140000 /* VML_FTZDAZ_OFF */ | 0x100 /* VML_ERRMODE_IGNORE */);
}

/* Contract: py_transform.h. */
int
fl_py_blur_exp(const char *name, fl_gblur *g)
{
    if (strcmp(name, "sleef") == 0) {
        g->vexp = NULL;
        g->vexp_ctx = NULL;
        return 0;
    }
    if (strcmp(name, "mkl") != 0) {
        PyErr_Format(PyExc_ValueError, "transform spec: 'blur.exp' must be 'mkl' or 'sleef', not '%.100s'", name);
        return -1;
    }
    if (fl_torch_mkl.fn == NULL) {
        void *h = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
        void *sym = h != NULL ? dlsym(h, "vmsExp") : NULL;
        if (sym == NULL) {
            if (h != NULL)
                dlclose(h);
            PyErr_SetString(PyExc_ValueError, "transform spec: 'blur.exp' 'mkl' needs torch imported, with MKL's "
                                              "vmsExp in its libtorch_cpu.so");
            return -1;
        }
        /* the handle stays open: torch never unloads, and the function is used from now on */
        memcpy(&fl_torch_mkl.fn, &sym, sizeof sym);
    }
    g->vexp = fl_torch_mkl_vexp;
    g->vexp_ctx = &fl_torch_mkl;
    return 0;
}

/* The "blur" dict (p, pos, sigma (lo, hi), kernel (kx, ky), v2, lanes, and
 * for v1 exp "mkl" | "sleef") -> B.  Returns 0 or -1 with an exception;
 * the ranges are fl_tspec_check's. */
static int
fl_blur_from_pydict(PyObject *v, fl_blur *B)
{
    memset(B, 0, sizeof *B);
    if (!PyDict_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "transform spec: 'blur' must be a dict");
        return -1;
    }
    PyObject *p = PyDict_GetItemString(v, "p"), *pos = PyDict_GetItemString(v, "pos");
    PyObject *sigma = PyDict_GetItemString(v, "sigma"), *kernel = PyDict_GetItemString(v, "kernel");
    PyObject *v2 = PyDict_GetItemString(v, "v2"), *lanes = PyDict_GetItemString(v, "lanes");
    PyObject *exp = PyDict_GetItemString(v, "exp");
    if (p == NULL || pos == NULL || sigma == NULL || kernel == NULL || v2 == NULL || lanes == NULL) {
        PyErr_SetString(PyExc_ValueError, "transform spec: 'blur' needs 'p', 'pos', 'sigma', 'kernel', 'v2' and "
                                          "'lanes'");
        return -1;
    }
    if (fl_get_double(p, "blur.p", &B->p) < 0 || fl_get_int(pos, "blur.pos", &B->pos) < 0
        || fl_get_int(lanes, "blur.lanes", &B->k.lanes) < 0)
        return -1;
    if (!PyArg_ParseTuple(sigma, "dd", &B->lo, &B->hi)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "transform spec: 'blur.sigma' must be a pair of floats");
        return -1;
    }
    if (!PyArg_ParseTuple(kernel, "ii", &B->k.kx, &B->k.ky)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "transform spec: 'blur.kernel' must be a pair of ints (kx, ky)");
        return -1;
    }
    int is_v2 = PyObject_IsTrue(v2);
    if (is_v2 < 0)
        return -1;
    B->k.v2 = is_v2;
    if (!is_v2) {   /* v1's exp is torch.exp's; v2's softmax has its own */
        const char *name = exp != NULL && PyUnicode_Check(exp) ? PyUnicode_AsUTF8(exp) : NULL;
        if (name == NULL) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "transform spec: 'blur' v1 needs 'exp', 'mkl' or 'sleef'");
            return -1;
        }
        if (fl_py_blur_exp(name, &B->k) < 0)
            return -1;
    }
    if (PyDict_Size(v) != 6 + (exp != NULL)) {
        PyErr_SetString(PyExc_ValueError, "transform spec: 'blur' has keys other than p, pos, sigma, kernel, v2, "
                                          "lanes and exp");
        return -1;
    }
    return 0;
}

int
fl_tspec_from_pydict(PyObject *module, PyObject *d, fl_tspec *out)
{
    static const char *const geoms[] = {"none", "rrc", "resize_crop"};
    static const char *const dtypes[] = {"uint8", "float16", "bfloat16", "float32"};
    static const char *const layouts[] = {"CHW", "HWC"};
    fl_tspec t;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    int have_norm = 0, nmean = 0, nstd = 0;

    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "transform spec must be a dict");
        return -1;
    }
    memset(&t, 0, sizeof t);
    t.geom = FL_GEOM_NONE;
    t.scale_lo = 0.08;
    t.scale_hi = 1.0;
    t.ratio_lo = 3.0 / 4.0;
    t.ratio_hi = 4.0 / 3.0;
    t.out_channels = 3;
    t.dtype = FL_DT_U8;
    t.layout = FL_LAYOUT_CHW;
    t.std[0] = t.std[1] = t.std[2] = 1.0f;

    while (PyDict_Next(d, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int rc;
        if (k == NULL) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "transform spec: keys must be strings");
            return -1;
        }
#define INT_FIELD(name) else if (strcmp(k, #name) == 0) rc = fl_get_int(value, k, &t.name)
#define DBL_FIELD(name) else if (strcmp(k, #name) == 0) rc = fl_get_double(value, k, &t.name)
        if (strcmp(k, "geom") == 0)
            rc = fl_get_choice(value, k, geoms, 3, &t.geom);
        else if (strcmp(k, "dtype") == 0)
            rc = fl_get_choice(value, k, dtypes, 4, &t.dtype);
        else if (strcmp(k, "layout") == 0)
            rc = fl_get_choice(value, k, layouts, 2, &t.layout);
        else if (strcmp(k, "normalize") == 0) {
            rc = PyObject_IsTrue(value);
            if (rc >= 0) {
                t.normalize = rc;
                have_norm = 1;
                rc = 0;
            }
        } else if (strcmp(k, "policy") == 0)
            rc = fl_policy_from_pydict(value, &t.policy);
        else if (strcmp(k, "erase") == 0)
            rc = fl_erase_from_pydict(value, &t.erase);
        else if (strcmp(k, "jitter") == 0)
            rc = fl_jitter_from_pydict(value, &t.jitter);
        else if (strcmp(k, "blur") == 0)
            rc = fl_blur_from_pydict(value, &t.blur);
        else if (strcmp(k, "rot_fill") == 0) {
            rc = PyArg_ParseTuple(value, "iii", &t.rot_fill[0], &t.rot_fill[1], &t.rot_fill[2]) ? 0 : -1;
            if (rc < 0) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "transform spec: 'rot_fill' must be a tuple of 3 ints");
            }
        }
        else if (strcmp(k, "aff_shear") == 0) {   /* 2 or 4 floats: the x range, then the y range */
            PyObject *seq = PySequence_Fast(value, "");
            Py_ssize_t ns = seq ? PySequence_Fast_GET_SIZE(seq) : -1;
            rc = 0;
            if (ns != 2 && ns != 4) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "transform spec: 'aff_shear' must be 2 or 4 floats");
                rc = -1;
            }
            for (Py_ssize_t i = 0; rc == 0 && i < ns; i++)
                rc = fl_get_double(PySequence_Fast_GET_ITEM(seq, i), k, &t.aff_shear[i]);
            Py_XDECREF(seq);
            t.aff_nshear = rc == 0 ? (int)ns : 0;
        }
        else if (strcmp(k, "mean") == 0)
            rc = nmean = fl_get_floats3(value, k, t.mean);
        else if (strcmp(k, "std") == 0)
            rc = nstd = fl_get_floats3(value, k, t.std);
        INT_FIELD(out_h);
        INT_FIELD(out_w);
        DBL_FIELD(scale_lo);
        DBL_FIELD(scale_hi);
        DBL_FIELD(ratio_lo);
        DBL_FIELD(ratio_hi);
        INT_FIELD(resize_short);
        INT_FIELD(resize_h);
        INT_FIELD(resize_w);
        INT_FIELD(max_size);
        INT_FIELD(crop_h);
        INT_FIELD(crop_w);
        DBL_FIELD(flip_p);
        DBL_FIELD(vflip_p);
        DBL_FIELD(gray_p);
        INT_FIELD(rotate);
        DBL_FIELD(rot_lo);
        DBL_FIELD(rot_hi);
        INT_FIELD(rot_interp);
        DBL_FIELD(aff_tx);
        DBL_FIELD(aff_ty);
        DBL_FIELD(aff_scale_lo);
        DBL_FIELD(aff_scale_hi);
        INT_FIELD(aff_center);
        DBL_FIELD(aff_cx);
        DBL_FIELD(aff_cy);
        INT_FIELD(interp);
        INT_FIELD(out_channels);
        INT_FIELD(scale_to_unit);
        else {
            PyErr_Format(PyExc_ValueError, "transform spec: unknown key '%s'", k);
            return -1;
        }
#undef INT_FIELD
#undef DBL_FIELD
        if (rc < 0)
            return -1;
    }
    if (!have_norm)
        t.normalize = nmean > 0 || nstd > 0;
    if (t.normalize && ((nmean == 3 && t.out_channels == 1) || (nstd == 3 && t.out_channels == 1))) {
        PyErr_SetString(PyExc_ValueError, "transform spec: 'mean'/'std' have 3 values for 1 output channel");
        return -1;
    }
    fl_err err = {0};
    if (fl_tspec_check(&t, &err) < 0) {
        fl_err named = err;
        snprintf(named.msg, sizeof named.msg, "transform spec: %.1000s", err.msg);
        fl_py_raise(module, &named, NULL, NULL);
        return -1;
    }
    *out = t;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* plan <-> dict                                                            */

/* Contract: py_transform.h. */
PyObject *
fl_plan_to_dict(const fl_plan *p)
{
    PyObject *aug = PyList_New(p->naug), *aug_interp = PyList_New(p->naug), *erase;
    if (aug == NULL || aug_interp == NULL) {
        Py_XDECREF(aug);
        Py_XDECREF(aug_interp);
        return NULL;
    }
    for (int i = 0; i < p->naug; i++) {
        PyObject *v = PyLong_FromLong(p->aug_interp[i]);
        if (v == NULL) {
            Py_DECREF(aug);
            Py_DECREF(aug_interp);
            return NULL;
        }
        PyList_SET_ITEM(aug_interp, i, v);
    }
    for (int i = 0; i < p->naug; i++) {
        PyObject *item = Py_BuildValue("(id)", p->aug_op[i], p->aug_mag[i]);
        if (item == NULL) {
            Py_DECREF(aug);
            Py_DECREF(aug_interp);
            return NULL;
        }
        PyList_SET_ITEM(aug, i, item);
    }
    if (p->nerase) {
        erase = PyList_New(p->nerase);
        for (int i = 0; erase != NULL && i < p->nerase; i++) {
            const int *b = p->erase_box[i];
            PyObject *item = Py_BuildValue("(iiii)", b[0], b[1], b[2], b[3]);
            if (item == NULL)
                Py_CLEAR(erase);
            else
                PyList_SET_ITEM(erase, i, item);
        }
    } else
        erase = Py_NewRef(Py_None);
    if (erase == NULL) {
        Py_DECREF(aug);
        Py_DECREF(aug_interp);
        return NULL;
    }
    PyObject *mix = Py_NewRef(Py_None);
    if (p->mix_chains > 0) {
        PyObject *wl = PyList_New(p->mix_chains), *ll = PyList_New(p->mix_chains);
        for (int i = 0; wl != NULL && ll != NULL && i < p->mix_chains; i++) {
            PyObject *a = PyFloat_FromDouble(p->mix_w[i]), *b = PyLong_FromLong(p->mix_len[i]);
            if (a == NULL || b == NULL) {
                Py_XDECREF(a);
                Py_XDECREF(b);
                Py_CLEAR(wl);
                break;
            }
            PyList_SET_ITEM(wl, i, a);
            PyList_SET_ITEM(ll, i, b);
        }
        Py_DECREF(mix);
        mix = wl != NULL && ll != NULL ? Py_BuildValue("{s:d,s:O,s:O,s:O}", "w0", (double)p->mix_w0, "w", wl, "len",
                                                       ll, "timm", p->mix_timm ? Py_True : Py_False)
                                       : NULL;
        Py_XDECREF(wl);
        Py_XDECREF(ll);
    }
    if (mix == NULL) {
        Py_DECREF(aug);
        Py_DECREF(aug_interp);
        Py_DECREF(erase);
        return NULL;
    }
    int has_affine = 0;   /* RandomAffine's parameters, when an op takes them */
    for (int i = 0; i < p->naug; i++)
        has_affine |= p->aug_op[i] == FL_AUG_TV_AFFINE || p->aug_op[i] == FL_AUG_TV_AFFINE_V2;
    PyObject *affine = has_affine ? Py_BuildValue("(dddddddd)", p->aff[0], p->aff[1], p->aff[2], p->aff[3],
                                                  p->aff[4], p->aff[5], p->aff[6], p->aff[7])
                                  : Py_NewRef(Py_None);
    if (affine == NULL) {
        Py_DECREF(aug);
        Py_DECREF(aug_interp);
        Py_DECREF(erase);
        Py_DECREF(mix);
        return NULL;
    }
    PyObject *blur = p->blur > 0 ? PyFloat_FromDouble(p->blur) : Py_NewRef(Py_None);
    if (blur == NULL) {
        Py_DECREF(aug);
        Py_DECREF(aug_interp);
        Py_DECREF(erase);
        Py_DECREF(mix);
        Py_DECREF(affine);
        return NULL;
    }
    return Py_BuildValue("{s:(iiii),s:(ii),s:(ii),s:O,s:O,s:O,s:(ii),s:i,s:N,s:N,s:N,s:K,s:N,s:N,s:N}", "box", p->box_x,
                         p->box_y,
                         p->box_w, p->box_h, "resized", p->rs_w, p->rs_h, "window", p->win_x, p->win_y, "flip",
                         p->flip ? Py_True : Py_False, "vflip", p->vflip ? Py_True : Py_False, "gray",
                         p->gray ? Py_True : Py_False, "out", p->out_w, p->out_h, "interp", p->interp, "aug", aug,
                         "aug_interp", aug_interp, "erase", erase, "erase_key", (unsigned long long)p->erase_key, "mix",
                         mix, "affine", affine, "blur", blur);
}

/* Read n ints from d[key] into out.  Returns 0, 1 when missing and optional,
 * or -1 with an exception. */
static int
fl_plan_ints(PyObject *d, const char *key, int n, int *out, int optional)
{
    PyObject *v = PyDict_GetItemString(d, key);   /* borrowed */
    if (v == NULL) {
        if (optional)
            return 1;
        PyErr_Format(PyExc_ValueError, "plan: missing key '%s'", key);
        return -1;
    }
    PyObject *seq = PySequence_Fast(v, "");
    if (seq == NULL || PySequence_Fast_GET_SIZE(seq) != n) {
        Py_XDECREF(seq);
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "plan: '%s' must be a sequence of %d ints", key, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (fl_get_int(PySequence_Fast_GET_ITEM(seq, i), key, &out[i]) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* A _plan_sample dict -> *p, for a render under the spec t: out defaults to
 * the spec's (else the resized) size, flip, vflip and gray to False, aug to none, erase to
 * None, interp to the spec's (needed when the spec's is 2, random; ignored
 * otherwise, as fl_render ignores it).  GIL held; borrows d.  Returns 0, or
 * -1 with TypeError/ValueError naming the key. */
static int
fl_plan_from_dict(PyObject *d, const fl_tspec *t, fl_plan *p)
{
    int box[4], rs[2], win[2], o[2];
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "plan must be a dict (as returned by _plan_sample)");
        return -1;
    }
    if (fl_plan_ints(d, "box", 4, box, 0) < 0 || fl_plan_ints(d, "resized", 2, rs, 0) < 0
        || fl_plan_ints(d, "window", 2, win, 0) < 0)
        return -1;
    int rc = fl_plan_ints(d, "out", 2, o, 1);
    if (rc < 0)
        return -1;
    if (rc == 1) {   /* default: the spec's size, else the resized size */
        o[0] = t->out_w ? t->out_w : rs[0];
        o[1] = t->out_w ? t->out_h : rs[1];
    }
    PyObject *f = PyDict_GetItemString(d, "flip"), *vf = PyDict_GetItemString(d, "vflip");
    int flip = f ? PyObject_IsTrue(f) : 0;
    if (flip < 0)
        return -1;
    int vflip = vf ? PyObject_IsTrue(vf) : 0;
    if (vflip < 0)
        return -1;
    PyObject *gr = PyDict_GetItemString(d, "gray");
    int gray = gr ? PyObject_IsTrue(gr) : 0;
    if (gray < 0)
        return -1;
    /* interp: the sample's draw, needed for a spec with interp 2 (random);
     * otherwise the spec's filter is the one (fl_render ignores the plan's) */
    PyObject *iv = PyDict_GetItemString(d, "interp");
    int interp = t->interp;
    if (iv != NULL && fl_get_int(iv, "interp", &interp) < 0)
        return -1;
    if (t->interp == FL_INTERP_RANDOM && (iv == NULL || (interp != FL_INTERP_BILINEAR && interp != FL_INTERP_BICUBIC))) {
        PyErr_SetString(PyExc_ValueError, "plan: a spec with interp 2 (random) needs the plan's 'interp', "
                                          "0 (bilinear) or 1 (bicubic)");
        return -1;
    }
    if (t->interp != FL_INTERP_RANDOM)
        interp = t->interp;
    memset(p, 0, sizeof *p);
    p->box_x = box[0];
    p->box_y = box[1];
    p->box_w = box[2];
    p->box_h = box[3];
    p->rs_w = rs[0];
    p->rs_h = rs[1];
    p->win_x = win[0];
    p->win_y = win[1];
    p->flip = flip;
    p->vflip = vflip;
    p->gray = gray;
    p->interp = interp;
    p->out_w = o[0];
    p->out_h = o[1];
    PyObject *aug = PyDict_GetItemString(d, "aug"), *erase = PyDict_GetItemString(d, "erase");
    if (aug != NULL) {
        PyObject *seq = PySequence_Fast(aug, "plan: 'aug' must be a sequence of (op, magnitude)");
        if (seq == NULL)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > FL_PLAN_MAX_AUG) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "plan: 'aug' has %zd ops, more than %d", n, FL_PLAN_MAX_AUG);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "id", &p->aug_op[i], &p->aug_mag[i])) {
                Py_DECREF(seq);
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "plan: 'aug' items must be (op, magnitude)");
                return -1;
            }
        }
        p->naug = (int)n;
        Py_DECREF(seq);
    }
    for (int i = 0; i < p->naug; i++)   /* each op's filter: the policy's unless the plan says */
        p->aug_interp[i] = t->policy.interp;
    PyObject *aug_interp = PyDict_GetItemString(d, "aug_interp");
    if (aug_interp != NULL && fl_plan_ints(d, "aug_interp", p->naug, p->aug_interp, 0) < 0)
        return -1;
    if (erase != NULL && erase != Py_None) {
        PyObject *seq = PySequence_Fast(erase, "plan: 'erase' must be None or a list of (x, y, w, h)");
        if (seq == NULL)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > FL_ERASE_MAX_BOXES) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "plan: 'erase' has %zd boxes, more than %d", n, FL_ERASE_MAX_BOXES);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            int *b = p->erase_box[i];
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiii", &b[0], &b[1], &b[2], &b[3])) {
                Py_DECREF(seq);
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "plan: 'erase' boxes must be (x, y, w, h)");
                return -1;
            }
        }
        p->nerase = (int)n;
        Py_DECREF(seq);
    }
    PyObject *key = PyDict_GetItemString(d, "erase_key");
    if (key != NULL) {
        p->erase_key = PyLong_AsUnsignedLongLongMask(key);
        if (PyErr_Occurred())
            return -1;
    }
    PyObject *blur = PyDict_GetItemString(d, "blur");   /* GaussianBlur's sigma, or None */
    if (blur != NULL && blur != Py_None && fl_get_double(blur, "blur", &p->blur) < 0)
        return -1;
    PyObject *affine = PyDict_GetItemString(d, "affine");
    if (affine != NULL && affine != Py_None
        && !PyArg_ParseTuple(affine, "dddddddd", &p->aff[0], &p->aff[1], &p->aff[2], &p->aff[3], &p->aff[4],
                             &p->aff[5], &p->aff[6], &p->aff[7])) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "plan: 'affine' must be None or 8 floats");
        return -1;
    }
    PyObject *mix = PyDict_GetItemString(d, "mix");
    if (mix != NULL && mix != Py_None) {   /* AugMix: {"w0": float, "w": [float, ...], "len": [int, ...]} */
        PyObject *w0 = PyDict_Check(mix) ? PyDict_GetItemString(mix, "w0") : NULL;
        PyObject *wl = PyDict_Check(mix) ? PyDict_GetItemString(mix, "w") : NULL;
        double w0d;
        if (w0 == NULL || wl == NULL || fl_get_double(w0, "mix.w0", &w0d) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "plan: 'mix' must be None or a dict with 'w0', 'w' and 'len'");
            return -1;
        }
        Py_ssize_t n = PySequence_Check(wl) ? PySequence_Size(wl) : -1;
        if (n < 1 || n > FL_POLICY_MAX_ROUNDS) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "plan: 'mix.w' must hold 1..%d weights", FL_POLICY_MAX_ROUNDS);
            return -1;
        }
        if (fl_plan_ints(mix, "len", (int)n, p->mix_len, 0) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PySequence_GetItem(wl, i);
            double wd;
            int rc2 = item == NULL ? -1 : fl_get_double(item, "mix.w", &wd);
            Py_XDECREF(item);
            if (rc2 < 0)
                return -1;
            p->mix_w[i] = (float)wd;
        }
        p->mix_w0 = (float)w0d;
        p->mix_chains = (int)n;
        PyObject *timm = PyDict_GetItemString(mix, "timm");   /* optional: torchvision's mix by default */
        int is_timm = timm != NULL ? PyObject_IsTrue(timm) : 0;
        if (is_timm < 0)
            return -1;
        p->mix_timm = is_timm;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* module functions                                                         */

static PyObject *
fl_py_plan_sample(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"spec", "src_w", "src_h", "seed", "epoch", "index", NULL};
    PyObject *spec;
    int w, h;
    unsigned long long seed = 0, epoch = 0, index = 0;
    fl_tspec t;
    fl_plan p;
    fl_err err = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oii|KKK:_plan_sample", kwlist, &spec, &w, &h, &seed, &epoch,
                                     &index))
        return NULL;
    if (fl_tspec_from_pydict(m, spec, &t) < 0)
        return NULL;
    if (fl_plan_sample(&t, w, h, seed, epoch, index, &p, &err) < 0)
        return fl_py_raise(m, &err, NULL, NULL);
    return fl_plan_to_dict(&p);
}

/* Parse an optional pair of floats; returns 0 or -1 with an exception. */
static int
fl_pair(PyObject *v, const char *name, double out[2])
{
    if (v == NULL || v == Py_None)
        return 0;
    if (!PyArg_ParseTuple(v, "dd", &out[0], &out[1])) {
        PyErr_Format(PyExc_TypeError, "render: '%s' must be a pair of floats", name);
        return -1;
    }
    return 0;
}

static PyObject *
fl_py_render(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"spec", "image", "plan", "seed", "epoch", "index",
                             "view_scale", "view_origin", "src_size", NULL};
    PyObject *spec, *image, *plan_obj = Py_None, *vscale = NULL, *vorigin = NULL, *srcsize = NULL;
    unsigned long long seed = 0, epoch = 0, index = 0;
    PyArrayObject *arr = NULL, *res = NULL;
    double scale[2] = {1.0, 1.0}, origin[2] = {0.0, 0.0};
    fl_tspec t;
    fl_plan p;
    fl_view v;
    fl_scratch scratch = {NULL, 0};
    fl_err err = {0};
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OKKK$OOO:_render", kwlist, &spec, &image, &plan_obj, &seed,
                                     &epoch, &index, &vscale, &vorigin, &srcsize))
        return NULL;
    if (fl_tspec_from_pydict(m, spec, &t) < 0)
        return NULL;
    if (fl_pair(vscale, "view_scale", scale) < 0 || fl_pair(vorigin, "view_origin", origin) < 0)
        return NULL;
    if (!(scale[0] > 0 && scale[1] > 0)) {
        PyErr_SetString(PyExc_ValueError, "render: view_scale must be positive");
        return NULL;
    }
    arr = (PyArrayObject *)PyArray_FROM_OF(image, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
    if (arr == NULL)
        return NULL;
    if (PyArray_TYPE(arr) != NPY_UINT8) {
        PyErr_SetString(PyExc_TypeError, "render: image must be a uint8 array");
        goto error;
    }
    if (!(PyArray_NDIM(arr) == 2 || (PyArray_NDIM(arr) == 3 && (PyArray_DIM(arr, 2) == 1 || PyArray_DIM(arr, 2) == 3)))
        || PyArray_DIM(arr, 0) <= 0 || PyArray_DIM(arr, 1) <= 0 || PyArray_DIM(arr, 0) > FL_MAX_DIM
        || PyArray_DIM(arr, 1) > FL_MAX_DIM) {
        PyErr_SetString(PyExc_ValueError, "render: image must be a non-empty [H, W] or [H, W, 1|3] array");
        goto error;
    }
    memset(&v, 0, sizeof v);
    v.data = (const uint8_t *)PyArray_DATA(arr);
    v.h = (int)PyArray_DIM(arr, 0);
    v.w = (int)PyArray_DIM(arr, 1);
    v.channels = PyArray_NDIM(arr) == 3 ? (int)PyArray_DIM(arr, 2) : 1;
    v.stride = (size_t)PyArray_STRIDE(arr, 0);
    v.scale_x = scale[0];
    v.scale_y = scale[1];
    v.origin_x = origin[0];
    v.origin_y = origin[1];

    if (plan_obj == Py_None) {
        int sw, sh;
        if (srcsize != NULL && srcsize != Py_None) {
            if (!PyArg_ParseTuple(srcsize, "ii", &sw, &sh)) {
                PyErr_SetString(PyExc_TypeError, "render: 'src_size' must be (w, h)");
                goto error;
            }
        } else {
            double dw = (v.w + origin[0]) / scale[0] + 0.5, dh = (v.h + origin[1]) / scale[1] + 0.5;
            if (!(dw >= 1.0 && dw <= FL_MAX_DIM && dh >= 1.0 && dh <= FL_MAX_DIM)) {
                PyErr_Format(PyExc_ValueError, "render: the view implies a source of %g x %g pixels", dw, dh);
                goto error;
            }
            sw = (int)dw;
            sh = (int)dh;
        }
        if (fl_plan_sample(&t, sw, sh, seed, epoch, index, &p, &err) < 0) {
            fl_py_raise(m, &err, NULL, NULL);
            goto error;
        }
    } else if (fl_plan_from_dict(plan_obj, &t, &p) < 0) {
        goto error;
    }

    {
        int ow = t.out_w ? t.out_w : p.out_w, oh = t.out_w ? t.out_h : p.out_h;
        static const int npy_types[4] = {NPY_UINT8, NPY_FLOAT16, NPY_UINT16, NPY_FLOAT32};
        npy_intp dims[3];
        if (ow <= 0 || oh <= 0 || ow > FL_MAX_DIM || oh > FL_MAX_DIM) {
            PyErr_Format(PyExc_ValueError, "render: invalid output size %d x %d", ow, oh);
            goto error;
        }
        if (t.layout == FL_LAYOUT_CHW) {
            dims[0] = t.out_channels;
            dims[1] = oh;
            dims[2] = ow;
        } else {
            dims[0] = oh;
            dims[1] = ow;
            dims[2] = t.out_channels;
        }
        res = (PyArrayObject *)PyArray_SimpleNew(3, dims, npy_types[t.dtype]);
        if (res == NULL)
            goto error;
    }
    /* Only fl_render runs without the GIL; arr and res stay referenced. */
    Py_BEGIN_ALLOW_THREADS
    rc = fl_render(&t, &p, &v, PyArray_DATA(res), &scratch, &err);
    fl_scratch_free(&scratch);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        fl_py_raise(m, &err, NULL, NULL);
        goto error;
    }
    Py_DECREF(arr);
    return (PyObject *)res;

error:
    Py_XDECREF(arr);
    Py_XDECREF(res);
    return NULL;
}

static PyMethodDef fl_transform_methods[] = {
    {"_plan_sample", (PyCFunction)(void (*)(void))fl_py_plan_sample, METH_VARARGS | METH_KEYWORDS,
     "_plan_sample(spec, src_w, src_h, seed=0, epoch=0, index=0) -> dict\n\n"
     "For tests and benchmarks.\n"
     "One sample's crop box, resize, window and flip, drawn as the native loader draws them\n"
     "(torchvision's algorithms, keyed by (seed, epoch, index)):\n"
     "dict(box=(x, y, w, h), resized=(w, h), window=(x, y), flip=bool, vflip=bool, gray=bool, out=(w, h),\n"
     "interp=0 (bilinear) | 1 (bicubic), aug=[(op, magnitude), ...], erase=None | [(x, y, w, h), ...], erase_key,\n"
     "mix, affine, blur=None | GaussianBlur's sigma)."},
    {"_render", (PyCFunction)(void (*)(void))fl_py_render, METH_VARARGS | METH_KEYWORDS,
     "_render(spec, image, plan=None, seed=0, epoch=0, index=0, *, view_scale=(1, 1),\n"
     "        view_origin=(0, 0), src_size=None) -> ndarray\n\n"
     "For tests and benchmarks.\n"
     "Run the native transform on one uint8 [H, W] / [H, W, C] image. Returns [C, H, W] or\n"
     "[H, W, C] in the spec's dtype (bfloat16 as uint16 raw bits)."},
    {NULL, NULL, 0, NULL},
};

int
fl_register_transform(PyObject *m)
{
    return PyModule_AddFunctions(m, fl_transform_methods);
}
