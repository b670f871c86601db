// The calling process's pid without a system call per use: libkolo checks it
// on every submit and wait (a forked child must not use its parent's
// connection), and glibc no longer caches getpid(). Cached at first use and
// refreshed in every child by a pthread_atfork handler (fork(), Python's
// os.fork and multiprocessing's fork start method all run it).
#pragma once

#include <sys/types.h>

namespace kolo {

pid_t currentPid();

}  // namespace kolo
