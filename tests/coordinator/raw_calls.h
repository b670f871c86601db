// Hostile raw calls for the coordinator's tests (issue 47): a streaming call
// whose request bytes are whatever the test gives (they need not parse),
// cancelled at once or after a short delay, through grpc::GenericStub.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

namespace kolo::coordinator::testing {

// What happened to one call.
struct RawOutcome {
  bool finished = false;  // Finish came back within the deadline
  grpc::Status status;
};

// Opens `method` (e.g. "/kolo.coord.Coordinator/WatchJob") on `channel`,
// sends `request` as the one message (WriteLast), cancels the call after
// `cancel_after` (0: right after the write was queued), and waits for its
// end, at most `deadline` in all.
RawOutcome rawCallCancelled(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& request,
                            std::chrono::milliseconds cancel_after,
                            std::chrono::milliseconds deadline = std::chrono::milliseconds(5000));

// Request bytes that do not parse as any protobuf message (a field whose
// length runs past the end).
std::string unparseableBytes(int variant);

}  // namespace kolo::coordinator::testing
