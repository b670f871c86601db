// Where the coordinator's Core sends a Record for every change of its
// durable state. The Journal (journal.h) writes them to disk; tests and the
// fuzzers replay them into a PersistedState to check nothing is missed.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/status.h"
#include "coordinator/persist/state_codec.h"

namespace kolo::coordinator::persist {

class RecordSink {
 public:
  virtual ~RecordSink() = default;
  // Takes the record (assigning its seq) and returns that seq. Never blocks
  // on I/O: it is called on the coordinator loop.
  virtual uint64_t append(Record record) = 0;
  // True when enough records piled up that a snapshot should replace them.
  virtual bool wantsCompaction() const { return false; }
  // Takes a snapshot of the state as of the last appended record.
  virtual void compact(PersistedState state) {}
  // Any thread: waits until the record `seq` is durable. Ok, the write error,
  // or TimedOut.
  virtual Status waitDurable(uint64_t seq, std::chrono::milliseconds timeout) { return okStatus(); }
};

// A sink that replays every record into a PersistedState in memory, through
// the text form (encode, decode, apply) exactly as recovery would. Used to
// check that the records describe every change (tests, fuzzers).
class MemorySink final : public RecordSink {
 public:
  uint64_t append(Record record) override {
    record.seq = ++seq_;
    const std::string line = encodeRecord(record);
    bytes_ += line.size() + 1;
    auto decoded = decodeRecord(line);
    if (!decoded.isOk()) {
      errors_ += decoded.status().message() + "\n";
      return seq_;
    }
    Status applied = applyRecord(*decoded, &state_);
    if (!applied.isOk()) errors_ += applied.message() + "\n";
    return seq_;
  }
  const PersistedState& state() const { return state_; }
  // Records that did not survive their own encoding (must stay empty).
  const std::string& errors() const { return errors_; }
  uint64_t seq() const { return seq_; }
  // The journal's length so far, were these records its lines.
  uint64_t bytes() const { return bytes_; }

 private:
  PersistedState state_;
  std::string errors_;
  uint64_t seq_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace kolo::coordinator::persist
