#ifndef TRIBUTARY_CDEFLATE_SHIM_H
#define TRIBUTARY_CDEFLATE_SHIM_H
// libdeflate: whole-buffer DEFLATE/gzip compression and a CRC-32 that uses the CPU's carry-less
// multiply (PCLMULQDQ) where it has one. Used for gzip compression, record CRCs and inflating gzip
// members of known size; zlib's streaming inflate takes the rest (it tells a truncated body from a
// corrupt one).
#include <libdeflate.h>
#endif
