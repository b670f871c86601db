#include "coordinator/persist/etcd_sink.h"

#include <fmt/format.h>

#include "common/log.h"
#include "coordinator/ha/etcd_client.h"

namespace kolo::coordinator::persist {

namespace {

constexpr size_t kMaxTxnRecords = 64;         // etcd's --max-txn-ops is 128
constexpr size_t kMaxTxnBytes = 1024 * 1024;  // etcd's --max-request-bytes is 1.5 MiB
constexpr size_t kSnapshotChunkBytes = 512 * 1024;

std::string seqText(uint64_t seq) { return fmt::format("{:020}", seq); }

}  // namespace

EtcdSink::EtcdSink(ha::EtcdClient* client, EtcdSinkOptions options)
    : client_(client), options_(std::move(options)) {
  if (options_.prefix.empty() || options_.prefix.back() != '/') options_.prefix += '/';
  options_.compact_records = std::max<uint64_t>(options_.compact_records, 1);
}

EtcdSink::~EtcdSink() { close(); }

std::string EtcdSink::recordKey(uint64_t seq) const {
  return options_.prefix + "records/" + seqText(seq);
}

StatusOr<LoadedState> EtcdSink::load() {
  std::string snapshot_text;
  ASSIGN_OR_RETURN(auto pointer, client_->range(snapshotKey()));
  if (pointer.kvs_size() > 0) {
    const std::string& v = pointer.kvs(0).value();
    unsigned long long seq = 0, chunks = 0;
    if (std::sscanf(v.c_str(), "%llu %llu", &seq, &chunks) != 2) {
      return invalidArgument("etcd " + snapshotKey() + ": malformed value '" + v + "'");
    }
    std::string chunk_prefix = snapshotKey() + "/" + seqText(seq) + "/";
    ASSIGN_OR_RETURN(auto parts, client_->range(chunk_prefix, ha::prefixRangeEnd(chunk_prefix)));
    if (static_cast<unsigned long long>(parts.kvs_size()) != chunks) {
      return invalidArgument(
          fmt::format("etcd {}: {} chunks, {} expected", chunk_prefix, parts.kvs_size(), chunks));
    }
    for (const auto& kv : parts.kvs()) snapshot_text += kv.value();
  }
  std::string records_prefix = options_.prefix + "records/";
  ASSIGN_OR_RETURN(auto records,
                   client_->range(records_prefix, ha::prefixRangeEnd(records_prefix)));
  std::string journal_text;
  for (const auto& kv : records.kvs()) {
    journal_text += kv.value();
    journal_text += '\n';
  }
  return loadState(snapshot_text, journal_text, "etcd " + snapshotKey(), "etcd " + records_prefix);
}

void EtcdSink::arm(std::string guard_key, int64_t guard_create_revision, uint64_t last_seq,
                   std::function<void(const Status&)> on_fenced) {
  std::lock_guard<std::mutex> lock(mu_);
  guard_key_ = std::move(guard_key);
  guard_revision_ = guard_create_revision;
  on_fenced_ = std::move(on_fenced);
  next_seq_ = std::max(next_seq_, last_seq);
  durable_seq_ = last_seq;
  if (!writer_.joinable()) writer_ = std::thread([this] { writerMain(); });
}

uint64_t EtcdSink::append(Record record) {
  std::lock_guard<std::mutex> lock(mu_);
  record.seq = ++next_seq_;
  Item item;
  item.seq = record.seq;
  item.line = encodeRecord(record);
  queue_.push_back(std::move(item));
  ++since_snapshot_;
  work_cv_.notify_one();
  return record.seq;
}

bool EtcdSink::wantsCompaction() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !snapshot_queued_ && since_snapshot_ >= options_.compact_records;
}

void EtcdSink::compact(PersistedState state) {
  std::lock_guard<std::mutex> lock(mu_);
  Item item;
  item.seq = next_seq_;
  item.snapshot = std::move(state);
  queue_.push_back(std::move(item));
  since_snapshot_ = 0;
  snapshot_queued_ = true;
  work_cv_.notify_one();
}

Status EtcdSink::waitDurable(uint64_t seq, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  bool done = durable_cv_.wait_for(
      lock, timeout, [&] { return durable_seq_ >= seq || !error_.isOk() || closed_; });
  if (durable_seq_ >= seq) return okStatus();
  if (!error_.isOk()) return error_;
  if (!done) {
    return timedOut("etcd at " + client_->endpointsText() +
                    " did not acknowledge the write within " + std::to_string(timeout.count()) +
                    " ms");
  }
  return unavailable("the etcd state store is closed");
}

namespace {

void addGuard(etcdserverpb::TxnRequest* txn, const std::string& key, int64_t revision) {
  auto* cmp = txn->add_compare();
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_target(etcdserverpb::Compare::CREATE);
  cmp->set_key(key);
  cmp->set_create_revision(revision);
}

void addPut(etcdserverpb::TxnRequest* txn, const std::string& key, const std::string& value) {
  auto* put = txn->add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
}

void addDelete(etcdserverpb::TxnRequest* txn, const std::string& key, const std::string& end) {
  auto* del = txn->add_success()->mutable_request_delete_range();
  del->set_key(key);
  del->set_range_end(end);
}

}  // namespace

Status EtcdSink::writeRecords(const std::deque<Item>& batch, size_t begin, size_t end) {
  etcdserverpb::TxnRequest txn;
  addGuard(&txn, guard_key_, guard_revision_);
  for (size_t i = begin; i < end; ++i) addPut(&txn, recordKey(batch[i].seq), batch[i].line);
  ASSIGN_OR_RETURN(auto resp, client_->txn(txn));
  if (!resp.succeeded()) {
    return aborted(fmt::format(
        "fenced: the election key {} (created at revision {}) is gone or belongs to another "
        "kolo-coordinator; this one is no longer the leader and may not write",
        guard_key_, guard_revision_));
  }
  return okStatus();
}

Status EtcdSink::writeSnapshot(const PersistedState& state, uint64_t seq) {
  std::string text = encodeSnapshot(state, seq);
  std::string chunk_prefix = snapshotKey() + "/" + seqText(seq) + "/";
  auto guarded = [&](etcdserverpb::TxnRequest txn) -> Status {
    ASSIGN_OR_RETURN(auto resp, client_->txn(txn));
    if (!resp.succeeded()) {
      return aborted(
          fmt::format("fenced: the election key {} (created at revision {}) is gone or "
                      "belongs to another kolo-coordinator",
                      guard_key_, guard_revision_));
    }
    return okStatus();
  };
  {  // leftovers of an unfinished snapshot at the same seq
    etcdserverpb::TxnRequest txn;
    addGuard(&txn, guard_key_, guard_revision_);
    addDelete(&txn, chunk_prefix, ha::prefixRangeEnd(chunk_prefix));
    RETURN_IF_ERROR(guarded(std::move(txn)));
  }
  size_t chunks = 0;
  for (size_t off = 0; off < text.size() || chunks == 0; off += kSnapshotChunkBytes) {
    etcdserverpb::TxnRequest txn;
    addGuard(&txn, guard_key_, guard_revision_);
    addPut(&txn, chunk_prefix + fmt::format("{:06}", chunks),
           text.substr(off, kSnapshotChunkBytes));
    RETURN_IF_ERROR(guarded(std::move(txn)));
    ++chunks;
  }
  etcdserverpb::TxnRequest txn;
  addGuard(&txn, guard_key_, guard_revision_);
  addPut(&txn, snapshotKey(), seqText(seq) + " " + std::to_string(chunks));
  addDelete(&txn, options_.prefix + "records/", recordKey(seq + 1));
  addDelete(&txn, snapshotKey() + "/", chunk_prefix);  // older snapshots
  return guarded(std::move(txn));
}

void EtcdSink::writerMain() {
  log::setThreadName("coord-etcd");
  auto logger = log::get("coord.etcd");
  bool failing = false;
  for (;;) {
    std::deque<Item> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && error_.isOk()); });
      if (queue_.empty() || !error_.isOk()) return;
      batch.swap(queue_);
    }
    size_t i = 0;
    while (i < batch.size()) {
      size_t end = i;
      Status st;
      bool snapshotted = false;
      if (batch[i].snapshot) {
        st = writeSnapshot(*batch[i].snapshot, batch[i].seq);
        end = i + 1;
        snapshotted = true;
      } else {
        size_t bytes = 0;
        while (end < batch.size() && !batch[end].snapshot && end - i < kMaxTxnRecords &&
               (end == i || bytes + batch[end].line.size() < kMaxTxnBytes)) {
          bytes += batch[end].line.size();
          ++end;
        }
        st = writeRecords(batch, i, end);
      }
      bool sticky =
          !st.isOk() && (st.code() == Code::kAborted || st.code() == Code::kInvalidArgument ||
                         st.code() == Code::kInternal);
      // Fenced, or a write etcd refuses (too large): the sink fails for good.
      // The owner hears it before any waiter does (it stops serving first).
      if (sticky) {
        logger->critical("{}: the coordinator no longer persists its state", st.message());
        if (on_fenced_) on_fenced_(st);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (st.isOk()) {
          durable_seq_ = std::max(durable_seq_, batch[end - 1].seq);
          if (snapshotted) {
            snapshot_queued_ = false;
            logger->debug("snapshot at seq {} in etcd", batch[i].seq);
          }
        } else if (sticky && error_.isOk()) {
          error_ = st;
        }
      }
      durable_cv_.notify_all();
      if (st.isOk()) {
        if (failing) logger->info("etcd acknowledges writes again");
        failing = false;
        i = end;
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_.isOk()) return;
        if (stopping_) {
          logger->error("closing with {} record(s) not acknowledged by etcd: {}", batch.size() - i,
                        st.message());
          return;
        }
      }
      if (!failing) logger->warn("{}; retrying", st.message());
      failing = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void EtcdSink::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  durable_cv_.notify_all();
}

}  // namespace kolo::coordinator::persist
