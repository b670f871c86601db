// Shared by the rank programs (kolo_check, kolo_check_ops): FAIL prints
// "rank R: FAIL <message>", shuts kolo down and returns 1 from the calling
// check. The including file defines `int g_rank`.
#pragma once

#include <cstdio>

#include "kolo/kolo_c.h"

#define FAIL(...)                          \
  do {                                     \
    std::printf("rank %d: FAIL ", g_rank); \
    std::printf(__VA_ARGS__);              \
    std::printf("\n");                     \
    std::fflush(stdout);                   \
    kolo_shutdown();                       \
    return 1;                              \
  } while (0)
