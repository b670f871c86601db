#include "tests/coordinator/raw_calls.h"

#include <grpcpp/generic/generic_stub.h>

#include <set>
#include <thread>

namespace kolo::coordinator::testing {

namespace {

// Waits for `tag` on `cq` until `until` (tags that came first are kept in
// `seen`); false on timeout or shutdown.
bool await(grpc::CompletionQueue* cq, std::set<void*>* seen, void* tag,
           std::chrono::system_clock::time_point until) {
  void* got = nullptr;
  bool ok = false;
  while (seen->count(tag) == 0) {
    auto r = cq->AsyncNext(&got, &ok, until);
    if (r != grpc::CompletionQueue::GOT_EVENT) return false;
    seen->insert(got);
  }
  return true;
}

}  // namespace

RawOutcome rawCallCancelled(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& request,
                            std::chrono::milliseconds cancel_after,
                            std::chrono::milliseconds deadline) {
  RawOutcome out;
  const auto until = std::chrono::system_clock::now() + deadline;
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(until);
  grpc::CompletionQueue cq;
  int start_tag = 1, write_tag = 2, done_tag = 3, finish_tag = 4;
  auto call = stub.PrepareCall(&ctx, method, &cq);
  call->StartCall(&start_tag);
  grpc::Slice slice(request);
  grpc::ByteBuffer buffer(&slice, 1);
  std::set<void*> seen;
  bool started = await(&cq, &seen, &start_tag, until);
  // One operation of a kind in flight at a time: the write, then the
  // half-close, then Finish (every tag comes back, ok or not, once the call
  // is cancelled).
  if (started) call->Write(buffer, &write_tag);
  if (cancel_after.count() > 0) std::this_thread::sleep_for(cancel_after);
  if (cancel_after.count() == 0) ctx.TryCancel();
  bool written = started && await(&cq, &seen, &write_tag, until);
  if (written) {
    call->WritesDone(&done_tag);
    written = await(&cq, &seen, &done_tag, until);
  }
  ctx.TryCancel();
  call->Finish(&out.status, &finish_tag);
  out.finished = written && await(&cq, &seen, &finish_tag, until);
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return out;
}

std::string unparseableBytes(int variant) {
  switch (variant % 4) {
    case 0:
      return std::string("\x0a\xff\xff\xff\x0f", 5);  // field 1: a length past the end
    case 1:
      return std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11);  // a bad varint tag
    case 2:
      return std::string("\x0b", 1);  // a group start, never ended
    default:
      return std::string("\x12\x05", 2) + "ab";  // field 2: 5 bytes announced, 2 sent
  }
}

}  // namespace kolo::coordinator::testing
