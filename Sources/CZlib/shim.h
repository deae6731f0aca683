#ifndef TRIBUTARY_CZLIB_SHIM_H
#define TRIBUTARY_CZLIB_SHIM_H
#include <zlib.h>

// inflateInit2 is a macro that Swift cannot import; wrap it. (Compression is libdeflate's: CDeflate.)
// 15 + 32: accept both zlib and gzip headers.
static inline int tributary_inflate_init_auto(z_streamp strm) {
    return inflateInit2(strm, 15 + 32);
}
#endif
