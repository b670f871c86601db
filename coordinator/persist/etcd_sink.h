// The coordinator's state in etcd (--etcd-endpoints): the same records and
// snapshots as the journal (state_codec.h, checksums included), as keys
// under a prefix P (default /kolo/default/):
//   P records/<seq, 20 digits>   one record line each
//   P snapshot                   "<seq> <chunks>": which snapshot is current
//   P snapshot/<seq>/<chunk>     the snapshot text (encodeSnapshot) in <= 512 KiB pieces
//   P leader                     the election key (coordinator/ha/leader_election.h)
// A record is durable when etcd acknowledged the Txn that wrote it. Every
// write is a Txn whose guard compares the election key's create_revision
// with the one this leader created: a deposed leader (its lease expired, the
// key deleted or re-created by another coordinator) cannot write (fencing);
// such a write fails the sink for good (Aborted "fenced: ...").
//
// Like the journal, append() only queues (it runs on the loop); the
// "coord-etcd" thread writes what piled up in one Txn (group commit, at most
// 64 records or 1 MiB a Txn). A write etcd does not answer is retried until
// it is acknowledged or the sink is fenced or closed; waitDurable's timeout
// bounds what a caller waits. Compaction writes the snapshot chunks, then in
// one guarded Txn points P snapshot at them and deletes the records it holds.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/status.h"
#include "coordinator/persist/record_sink.h"
#include "coordinator/persist/state_codec.h"

namespace kolo::coordinator::ha {
class EtcdClient;
}

namespace kolo::coordinator::persist {

struct EtcdSinkOptions {
  std::string prefix = "/kolo/default/";  // ends with '/'
  uint64_t compact_records = 10000;       // records between snapshots
};

class EtcdSink final : public RecordSink {
 public:
  EtcdSink(ha::EtcdClient* client, EtcdSinkOptions options);
  ~EtcdSink() override;
  EtcdSink(const EtcdSink&) = delete;
  EtcdSink& operator=(const EtcdSink&) = delete;

  // Reads the snapshot and the records (any thread, no loop): the state as
  // the journal's loadState builds it. InvalidArgument for a corrupt state,
  // Unavailable if etcd does not answer.
  StatusOr<LoadedState> load();

  // Starts the writer: every write is guarded by `guard_key` having been
  // created at `guard_create_revision`; seqs continue after `last_seq`.
  // `on_fenced` (writer thread) is told once when a write is refused,
  // before waitDurable reports it.
  void arm(std::string guard_key, int64_t guard_create_revision, uint64_t last_seq,
           std::function<void(const Status&)> on_fenced = nullptr);

  uint64_t append(Record record) override;
  bool wantsCompaction() const override;
  void compact(PersistedState state) override;
  Status waitDurable(uint64_t seq, std::chrono::milliseconds timeout) override;

  // Writes what is queued (bounded by the retries left: gives up at once if
  // etcd is unreachable) and stops the writer. Idempotent.
  void close();

  const std::string& prefix() const { return options_.prefix; }
  std::string recordKey(uint64_t seq) const;
  std::string snapshotKey() const { return options_.prefix + "snapshot"; }

 private:
  struct Item {
    uint64_t seq = 0;
    std::string line;                        // a record, or
    std::optional<PersistedState> snapshot;  // a snapshot as of `seq`
  };
  void writerMain();
  // Ok, Aborted (fenced: the guard failed), or another error (retry).
  Status writeRecords(const std::deque<Item>& batch, size_t begin, size_t end);
  Status writeSnapshot(const PersistedState& state, uint64_t seq);

  ha::EtcdClient* client_;
  EtcdSinkOptions options_;
  std::string guard_key_;
  int64_t guard_revision_ = 0;
  std::function<void(const Status&)> on_fenced_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable durable_cv_;
  std::deque<Item> queue_;
  uint64_t next_seq_ = 0;
  uint64_t durable_seq_ = 0;
  uint64_t since_snapshot_ = 0;
  bool snapshot_queued_ = false;
  Status error_;  // sticky: fenced
  bool stopping_ = false;
  bool closed_ = false;
  std::thread writer_;
};

}  // namespace kolo::coordinator::persist
