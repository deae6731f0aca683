#ifndef TRIBUTARY_CZLIB_SHIM_H
#define TRIBUTARY_CZLIB_SHIM_H
#include <zlib.h>

// inflateInit2 is a macro that Swift cannot import; wrap it. (Compression is libdeflate's: CDeflate.)
// zlib.h: "windowBits can also be greater than 15 for optional gzip decoding. Add 16 to windowBits to
// decode only the gzip format" (32 would take a zlib stream too, which no gzip coding is).
static inline int tributary_inflate_init_gzip(z_streamp strm) {
    return inflateInit2(strm, 15 + 16);
}
#endif
