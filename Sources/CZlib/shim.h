#ifndef TRIBUTARY_CZLIB_SHIM_H
#define TRIBUTARY_CZLIB_SHIM_H
#include <zlib.h>

// deflateInit2/inflateInit2 are macros that Swift cannot import; wrap them.
// windowBits 15 + 16 selects the gzip wrapper (RFC 1952).
static inline int tributary_deflate_init_gzip(z_streamp strm, int level) {
    return deflateInit2(strm, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
}
// 15 + 32: accept both zlib and gzip headers.
static inline int tributary_inflate_init_auto(z_streamp strm) {
    return inflateInit2(strm, 15 + 32);
}
#endif
