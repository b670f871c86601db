#include "coordinator/persist/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "common/log.h"

namespace kolo::coordinator::persist {

namespace {

// Reads a whole file; an absent file reads as empty.
StatusOr<std::string> readWholeFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::string();
    return errnoStatus("cannot open " + path, errno);
  }
  std::string out;
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("cannot read " + path, errno);
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Status writeFd(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("cannot write " + path, errno);
    }
    done += static_cast<size_t>(n);
  }
  return okStatus();
}

Status syncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return errnoStatus("cannot open " + dir, errno);
  if (::fsync(fd.get()) != 0) return errnoStatus("cannot fsync " + dir, errno);
  return okStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Journal>> Journal::open(const JournalOptions& options,
                                                 LoadedState* loaded) {
  auto logger = log::get("coord.journal");
  const std::string& dir = options.dir;
  if (dir.empty()) return invalidArgument("the state dir must not be empty");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return unavailable("cannot create state dir " + dir + ": " + ec.message());
  ::chmod(dir.c_str(), 0700);  // it holds job tokens

  std::string lock_path = dir + "/lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) return errnoStatus("cannot open " + lock_path, errno);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return unavailable("state dir " + dir + " is in use by another kolo-coordinator (it holds " +
                         lock_path + ")");
    }
    return errnoStatus("cannot lock " + lock_path, errno);
  }

  std::string snapshot_path = dir + "/snapshot";
  std::string journal_path = dir + "/journal";
  std::remove((snapshot_path + ".tmp").c_str());  // a compaction cut short
  ASSIGN_OR_RETURN(std::string snapshot, readWholeFile(snapshot_path));
  ASSIGN_OR_RETURN(std::string journal, readWholeFile(journal_path));
  auto state = loadState(snapshot, journal, snapshot_path, journal_path);
  if (!state.isOk()) {
    return invalidArgument("state dir " + dir + ": " + state.status().message() +
                           " (move the directory away to start empty)");
  }
  *loaded = std::move(state).value();

  UniqueFd jfd(::open(journal_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (!jfd.valid()) return errnoStatus("cannot open " + journal_path, errno);
  if (loaded->torn_tail) {
    logger->warn("{}: the last record was cut short (a crash while writing it); dropping it",
                 journal_path);
    if (::ftruncate(jfd.get(), static_cast<off_t>(loaded->valid_journal_bytes)) != 0 ||
        ::fsync(jfd.get()) != 0) {
      return errnoStatus("cannot truncate " + journal_path, errno);
    }
  }
  RETURN_IF_ERROR(syncDir(dir));
  logger->info(
      "state dir {}: {} agents, {} jobs, {} keys (snapshot{} + {} journal records, seq {})", dir,
      loaded->state.agents.size(), loaded->state.jobs.size(), loaded->state.kv.size(),
      snapshot.empty() ? " none" : "", loaded->journal_records, loaded->last_seq);
  return std::unique_ptr<Journal>(
      new Journal(options, std::move(lock), std::move(jfd), loaded->last_seq));
}

Journal::Journal(JournalOptions options, UniqueFd lock, UniqueFd journal, uint64_t last_seq)
    : options_(std::move(options)),
      lock_fd_(std::move(lock)),
      journal_fd_(std::move(journal)),
      next_seq_(last_seq),
      durable_seq_(last_seq) {
  writer_ = std::thread([this] { writerMain(); });
}

Journal::~Journal() { close(); }

void Journal::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  work_cv_.notify_all();
  writer_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  durable_cv_.notify_all();
}

uint64_t Journal::append(Record record) {
  std::lock_guard<std::mutex> lock(mu_);
  record.seq = ++next_seq_;
  Item item;
  item.seq = record.seq;
  item.line = encodeRecord(record);
  item.line += '\n';
  since_snapshot_bytes_ += item.line.size();
  queue_.push_back(std::move(item));
  ++since_snapshot_;
  work_cv_.notify_one();
  return record.seq;
}

bool Journal::wantsCompaction() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !snapshot_queued_ && (since_snapshot_ >= options_.compact_records ||
                               since_snapshot_bytes_ >= options_.compact_bytes);
}

void Journal::compact(PersistedState state) {
  std::lock_guard<std::mutex> lock(mu_);
  Item item;
  item.seq = next_seq_;
  item.snapshot = std::move(state);
  queue_.push_back(std::move(item));
  since_snapshot_ = 0;
  since_snapshot_bytes_ = 0;
  snapshot_queued_ = true;
  work_cv_.notify_one();
}

Status Journal::waitDurable(uint64_t seq, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  bool done = durable_cv_.wait_for(
      lock, timeout, [&] { return durable_seq_ >= seq || !error_.isOk() || closed_; });
  if (!error_.isOk()) return error_;
  if (durable_seq_ >= seq) return okStatus();
  if (!done) {
    return timedOut("the journal did not reach the disk within " + std::to_string(timeout.count()) +
                    " ms");
  }
  return unavailable("the journal is closed");
}

Status Journal::writeAll(const std::string& bytes) {
  if (bytes.empty()) return okStatus();
  RETURN_IF_ERROR(writeFd(journal_fd_.get(), bytes, journalPath()));
  if (::fdatasync(journal_fd_.get()) != 0)
    return errnoStatus("cannot fsync " + journalPath(), errno);
  return okStatus();
}

Status Journal::writeSnapshot(const PersistedState& state, uint64_t seq) {
  std::string tmp = snapshotPath() + ".tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return errnoStatus("cannot create " + tmp, errno);
    RETURN_IF_ERROR(writeFd(fd.get(), encodeSnapshot(state, seq), tmp));
    if (::fsync(fd.get()) != 0) return errnoStatus("cannot fsync " + tmp, errno);
  }
  if (std::rename(tmp.c_str(), snapshotPath().c_str()) != 0) {
    return errnoStatus("cannot rename " + tmp + " to " + snapshotPath(), errno);
  }
  RETURN_IF_ERROR(syncDir(options_.dir));
  // Every journal record is now in the snapshot (seq <= S is skipped on
  // replay), so a crash before this truncation is harmless.
  if (::ftruncate(journal_fd_.get(), 0) != 0 || ::fsync(journal_fd_.get()) != 0) {
    return errnoStatus("cannot truncate " + journalPath(), errno);
  }
  return okStatus();
}

void Journal::writerMain() {
  log::setThreadName("coord-journal");
  auto logger = log::get("coord.journal");
  for (;;) {
    std::deque<Item> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything is written
      batch.swap(queue_);
    }
    Status st;
    uint64_t written = 0;
    bool snapshotted = false;
    std::string pending;
    for (Item& item : batch) {
      if (!st.isOk()) break;
      if (!item.snapshot) {
        pending += item.line;
        written = item.seq;
        continue;
      }
      st = writeAll(pending);
      pending.clear();
      if (st.isOk()) st = writeSnapshot(*item.snapshot, item.seq);
      if (st.isOk()) {
        written = std::max(written, item.seq);
        snapshotted = true;
        logger->debug("snapshot at seq {} ({} agents, {} jobs, {} keys)", item.seq,
                      item.snapshot->agents.size(), item.snapshot->jobs.size(),
                      item.snapshot->kv.size());
      }
    }
    if (st.isOk()) st = writeAll(pending);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (snapshotted) snapshot_queued_ = false;
      if (!st.isOk() && error_.isOk()) {
        error_ = st;
        logger->critical("{}: the coordinator no longer persists its state", st.message());
      }
      if (st.isOk()) durable_seq_ = std::max(durable_seq_, written);
    }
    durable_cv_.notify_all();
  }
}

}  // namespace kolo::coordinator::persist
