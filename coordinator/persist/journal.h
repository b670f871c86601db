// The coordinator's state directory (--state-dir DIR):
//   DIR/lock       flock'ed while a coordinator uses the directory
//   DIR/snapshot   the state at some seq S (written to snapshot.tmp, fsync'd, renamed)
//   DIR/journal    append-only records after the snapshot, one JSON line each
// Records are appended by the loop (append() only queues them) and written
// by the journal's own thread ("coord-journal") in batches: write, then
// fdatasync, then the waiters of those seqs are released. A batch holds what
// piled up while the previous one was being synced, so the delay is one
// fsync at most. Compaction writes a snapshot and empties the journal; a
// crash at any point leaves snapshot + journal that replay to the same state
// (journal records with seq <= S are skipped).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/fd.h"
#include "common/status.h"
#include "coordinator/persist/record_sink.h"
#include "coordinator/persist/state_codec.h"

namespace kolo::coordinator::persist {

struct JournalOptions {
  std::string dir;
  // Journal records after which the loop is asked for a snapshot.
  uint64_t compact_records = 10000;
  // Or after this many journal bytes (issue 47: 10000 records of a few MB
  // each let a tenant's KvPuts grow the journal by GBs between snapshots).
  uint64_t compact_bytes = uint64_t{64} << 20;
};

class Journal final : public RecordSink {
 public:
  // Creates DIR (mode 0700) if needed, takes its lock, reads the snapshot
  // and the journal into `loaded` (cutting off a torn last line), and starts
  // the writer thread. Unavailable if another process holds the lock;
  // InvalidArgument (naming file and line) for a corrupt state.
  static StatusOr<std::unique_ptr<Journal>> open(const JournalOptions& options,
                                                 LoadedState* loaded);
  ~Journal() override;
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  uint64_t append(Record record) override;
  bool wantsCompaction() const override;
  void compact(PersistedState state) override;
  Status waitDurable(uint64_t seq, std::chrono::milliseconds timeout) override;

  // Writes out everything queued and stops the writer thread. Idempotent.
  void close();

  const std::string& dir() const { return options_.dir; }
  std::string journalPath() const { return options_.dir + "/journal"; }
  std::string snapshotPath() const { return options_.dir + "/snapshot"; }

 private:
  struct Item {
    uint64_t seq = 0;
    std::string line;                        // a record, or
    std::optional<PersistedState> snapshot;  // a snapshot as of `seq`
  };

  Journal(JournalOptions options, UniqueFd lock, UniqueFd journal, uint64_t last_seq);
  void writerMain();
  Status writeSnapshot(const PersistedState& state, uint64_t seq);
  Status writeAll(const std::string& bytes);

  JournalOptions options_;
  UniqueFd lock_fd_;
  UniqueFd journal_fd_;  // O_APPEND; only the writer thread uses it

  mutable std::mutex mu_;
  std::condition_variable work_cv_;     // writer waits for items
  std::condition_variable durable_cv_;  // waitDurable waits for durable_seq_
  std::deque<Item> queue_;
  uint64_t next_seq_;             // last seq handed out
  uint64_t durable_seq_;          // every record up to here is on disk
  uint64_t since_snapshot_ = 0;   // records appended since the last compact()
  uint64_t since_snapshot_bytes_ = 0;  // their bytes
  bool snapshot_queued_ = false;  // a compaction is queued or running
  Status error_;                  // the first write error (sticky)
  bool stopping_ = false;
  bool closed_ = false;  // the writer thread has exited
  std::thread writer_;
};

}  // namespace kolo::coordinator::persist
