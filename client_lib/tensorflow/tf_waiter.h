// Completion of kolo collectives for the TensorFlow op library, without
// TensorFlow headers (they are slow to compile).
//
// An AsyncOpKernel submits its collective and hands the C handles to the
// one waiter thread, which polls them (kolo_poll) and, once every handle of
// an entry has finished, synchronizes them (the result is copied out and
// kolo_last_error is read on the waiter thread, where it is set) and calls
// the entry's callback. Polling instead of blocking on the first handle means
// a collective that finishes early is never held back by one submitted
// before it, so no order of completions across ranks can deadlock.
//
// Submissions that themselves wait for every rank (allgather and alltoall
// exchange sizes first; barrier, join) run on a thread of their own
// (RunDetached), never on TensorFlow's executor threads.
#ifndef KOLO_CLIENT_LIB_TENSORFLOW_TF_WAITER_H_
#define KOLO_CLIENT_LIB_TENSORFLOW_TF_WAITER_H_

#include <functional>
#include <string>
#include <vector>

#include "kolo/kolo_c.h"

namespace kolo::tf {

// Called once every handle has finished: status KOLO_OK, or the first
// failing handle's status and its error text.
using WaitCallback = std::function<void(kolo_status_t status, const std::string& error)>;

// `keep_results`: the handles carry a library-owned result (allgather,
// alltoall); the callback reads it (kolo_result) and releases the handles.
void WatchHandles(std::vector<kolo_handle_t> handles, bool keep_results, WaitCallback cb);

// Runs `fn` on a new detached thread.
void RunDetached(std::function<void()> fn);

// kolo_last_error() of the calling thread, or the status' name when empty.
std::string LastError(kolo_status_t status);

}  // namespace kolo::tf

#endif  // KOLO_CLIENT_LIB_TENSORFLOW_TF_WAITER_H_
