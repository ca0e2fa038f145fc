/* pin.h: page-locked host memory, as the core asks for it.
 *
 * The pool (core/pool.c) and the shared-memory ring (core/shmring.c) page-lock
 * batch memory for pin_memory, but the core knows nothing of CUDA: whoever
 * creates a pinned pool or pins a slot hands them an fl_pinner, today the
 * CUDA layer's (fl_cuda_pinner(), cuda/cuda.h), through the binding.  Every
 * function may be called from any thread without the GIL, may block on the
 * driver (so never under the caller's locks), and returns 0, or nonzero with
 * *err filled (err may be NULL).
 */
#ifndef FL_PIN_H
#define FL_PIN_H

#include <stddef.h>

#include "core/err.h"

typedef struct fl_pinner {
    /* Allocate `bytes` page-locked for `device` into *ptr (the caller owns
     * it and gives it back with free_host, to the same pinner). */
    int (*alloc_host)(int device, size_t bytes, void **ptr, fl_err *err);
    int (*free_host)(int device, void *ptr, fl_err *err);
    /* Page-lock / unlock memory the caller already owns (a ring slot). */
    int (*lock)(int device, void *ptr, size_t bytes, fl_err *err);
    int (*unlock)(int device, void *ptr, fl_err *err);
} fl_pinner;

#endif
