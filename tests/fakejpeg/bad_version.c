/* bad_version.c: stands in for a libjpeg whose version or struct layout does
 * not match the headers fastloader was built with.  Preloaded into a child
 * process by tests/test_import_checks.py, it replaces jpeg_CreateDecompress
 * with what libjpeg itself does on such a mismatch: ERREXIT2 with
 * JERR_BAD_LIB_VERSION (library version, caller's version). */
#include <stdio.h>

#include <jpeglib.h>
#include <jerror.h>

__attribute__((visibility("default"))) void
jpeg_CreateDecompress(j_decompress_ptr cinfo, int version, size_t structsize)
{
    (void)structsize;
    cinfo->mem = NULL;
    cinfo->err->msg_code = JERR_BAD_LIB_VERSION;
    cinfo->err->msg_parm.i[0] = 99; /* "the library's" version */
    cinfo->err->msg_parm.i[1] = version;
    (*cinfo->err->error_exit)((j_common_ptr)cinfo);
}
