/* module.c: the fastloader._C module object.
 *
 * Multi-phase init; all state (exception objects, heap types) lives in the
 * module state, so there are no C globals holding Python objects.  The other
 * binding files register their functions through fl_register_* (binding.h).
 */
#include "binding/binding.h"
#include <numpy/arrayobject.h>
#include <jpeglib.h>

#include "image/codecs.h"
#include "image/jpeg.h"

#define FL_STR2(x) #x
#define FL_STR(x) FL_STR2(x)

static int
fl_exec(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    if (_import_array() < 0)
        return -1;
    /* libjpeg checks JPEG_LIB_VERSION and the struct size when a decoder is
     * created: a loaded library that does not match the headers this build
     * used fails here, once, with a clear message, instead of at the first
     * image of an epoch. */
    fl_jpeg *probe = fl_jpeg_new();
    if (probe == NULL) {
        PyErr_Format(PyExc_ImportError,
                     "fastloader._C: the libjpeg loaded at run time does not match the libjpeg-turbo %s headers "
                     "(JPEG_LIB_VERSION %d) it was built with; reinstall fastloader against the installed "
                     "libjpeg62-turbo", FL_STR(LIBJPEG_TURBO_VERSION), JPEG_LIB_VERSION);
        return -1;
    }
    fl_jpeg_free(probe);
    st->DecodeError = PyErr_NewExceptionWithDoc(
        "fastloader.DecodeError",
        "An image could not be decoded. The message names the file (or the "
        "sample index) and libjpeg's reason.",
        PyExc_ValueError, NULL);
    if (st->DecodeError == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "DecodeError", st->DecodeError) < 0)
        return -1;
    if (PyModule_AddStringConstant(m, "libjpeg_turbo_version", FL_STR(LIBJPEG_TURBO_VERSION)) < 0)
        return -1;
    if (PyModule_AddStringConstant(m, "libspng_version", fl_codecs_spng_version()) < 0)
        return -1;
    if (PyModule_AddStringConstant(m, "libdeflate_version", fl_codecs_deflate_version()) < 0)
        return -1;
    if (PyModule_AddStringConstant(m, "libwebp_version", fl_codecs_webp_version()) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "jpeg_lib_version", JPEG_LIB_VERSION) < 0)
        return -1;
    if (fl_register_buffer(m) < 0 || fl_register_engine(m) < 0 || fl_register_native(m) < 0 || fl_register_image(m) < 0 || fl_register_transform(m) < 0 ||
        fl_register_augment(m) < 0 || fl_register_mix(m) < 0 ||
        fl_register_cuda(m) < 0 || fl_register_devcopy(m) < 0 || fl_register_errors(m) < 0 || fl_register_source(m) < 0 ||
        fl_register_array(m) < 0 || fl_register_lmdb(m) < 0 || fl_register_stream(m) < 0 ||
        fl_register_shards(m) < 0 || fl_register_arrow(m) < 0)
        return -1;
    if (fl_register_native_call(m) < 0)
        return -1;
    if (fl_register_shmring(m) < 0)
        return -1;
    return 0;
}

static int
fl_traverse(PyObject *m, visitproc visit, void *arg)
{
    fl_module_state *st = fl_get_state(m);
    Py_VISIT(st->DecodeError);
    Py_VISIT(st->EngineBaseType);
    Py_VISIT(st->EngineType);
    Py_VISIT(st->BufferType);
    Py_VISIT(st->BatchPoolType);
    Py_VISIT(st->NativeDatasetType);
    Py_VISIT(st->NativeEngineType);
    Py_VISIT(st->DeviceCopierType);
    Py_VISIT(st->DeviceTensorType);
    Py_VISIT(st->SourceType);
    Py_VISIT(st->LMDBWriterType);
    Py_VISIT(st->ShmRingType);
    return 0;
}

static int
fl_clear(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    Py_CLEAR(st->DecodeError);
    Py_CLEAR(st->EngineBaseType);
    Py_CLEAR(st->EngineType);
    Py_CLEAR(st->BufferType);
    Py_CLEAR(st->BatchPoolType);
    Py_CLEAR(st->NativeDatasetType);
    Py_CLEAR(st->NativeEngineType);
    Py_CLEAR(st->DeviceCopierType);
    Py_CLEAR(st->DeviceTensorType);
    Py_CLEAR(st->SourceType);
    Py_CLEAR(st->LMDBWriterType);
    Py_CLEAR(st->ShmRingType);
    return 0;
}

static void
fl_free(void *m)
{
    fl_clear((PyObject *)m);
}

static PyModuleDef_Slot fl_slots[] = {
    {Py_mod_exec, fl_exec},
    {0, NULL},
};

static struct PyModuleDef fl_moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastloader._C",
    .m_doc = "fastloader's C core: worker pool, JPEG pipeline, DLPack export.",
    .m_size = sizeof(fl_module_state),
    .m_slots = fl_slots,
    .m_traverse = fl_traverse,
    .m_clear = fl_clear,
    .m_free = fl_free,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    return PyModuleDef_Init(&fl_moduledef);
}
