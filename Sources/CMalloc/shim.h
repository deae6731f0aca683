#ifndef TRIBUTARY_CMALLOC_SHIM_H
#define TRIBUTARY_CMALLOC_SHIM_H
// glibc's malloc tuning (mallopt), which Swift's Glibc module leaves out. Part of libc: nothing to link.
#include <malloc.h>
#endif
