// The C++17 build of header_check.c (see there).
#include "header_check.c"
