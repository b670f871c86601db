// Helpers shared by the backend tests: integer-valued test data with an exact
// reference (so results compare bit for bit whatever the reduction order),
// and a group of peers running as threads of this process.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"
#include "common/dtype.h"
#include "common/half.h"

namespace kolo::testing_backend {

using Bytes = std::vector<std::byte>;
using namespace std::chrono_literals;

inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Small integers whose sums/products/min/max over <= 4 ranks are exact in
// every dtype (float16 and bfloat16 included) and never overflow int8.
inline int64_t inputValue(ReduceOp op, DataType t, int rank, size_t i) {
  const uint64_t h = mix((static_cast<uint64_t>(rank) << 40) ^ i);
  const bool is_unsigned = t == DataType::kUint8;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return is_unsigned ? static_cast<int64_t>(h % 7) : static_cast<int64_t>(h % 7) - 3;
    case ReduceOp::kProduct: {
      static const int64_t kSigned[3] = {-1, 1, 2};
      return is_unsigned ? 1 + static_cast<int64_t>(h % 2) : kSigned[h % 3];
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return is_unsigned ? static_cast<int64_t>(h % 101) : static_cast<int64_t>(h % 101) - 50;
  }
  return 0;
}

inline int64_t combine(ReduceOp op, int64_t a, int64_t b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return 0;
}

inline void storeValue(DataType t, std::byte* base, size_t i, int64_t v) {
  switch (t) {
    case DataType::kFloat16: {
      uint16_t h = floatToHalf(static_cast<float>(v));
      std::memcpy(base + 2 * i, &h, 2);
      break;
    }
    case DataType::kBFloat16: {
      uint16_t h = floatToBf16(static_cast<float>(v));
      std::memcpy(base + 2 * i, &h, 2);
      break;
    }
    case DataType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(base + 4 * i, &f, 4);
      break;
    }
    case DataType::kFloat64: {
      double d = static_cast<double>(v);
      std::memcpy(base + 8 * i, &d, 8);
      break;
    }
    case DataType::kInt8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(base + i, &x, 1);
      break;
    }
    case DataType::kUint8: {
      uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(base + i, &x, 1);
      break;
    }
    case DataType::kInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(base + 4 * i, &x, 4);
      break;
    }
    case DataType::kInt64:
      std::memcpy(base + 8 * i, &v, 8);
      break;
  }
}

// Elements [first, first + count) of rank `rank`'s input.
inline Bytes makeInput(DataType t, ReduceOp op, int rank, size_t count, size_t first = 0) {
  Bytes b(count * dataTypeSize(t));
  for (size_t i = 0; i < count; ++i) storeValue(t, b.data(), i, inputValue(op, t, rank, first + i));
  return b;
}

// The reduction over ranks 0..size-1 of elements [first, first + count).
inline Bytes makeReference(DataType t, ReduceOp op, int size, size_t count, size_t first = 0) {
  Bytes b(count * dataTypeSize(t));
  for (size_t i = 0; i < count; ++i) {
    int64_t acc = inputValue(op, t, 0, first + i);
    for (int r = 1; r < size; ++r) acc = combine(op, acc, inputValue(op, t, r, first + i));
    storeValue(t, b.data(), i, acc);
  }
  return b;
}

// Rank-and-position dependent bytes for the byte-moving collectives.
inline Bytes patternBytes(int rank, size_t bytes, uint64_t salt = 0) {
  Bytes b(bytes);
  for (size_t i = 0; i < bytes; ++i)
    b[i] = static_cast<std::byte>(mix((salt << 48) ^ (static_cast<uint64_t>(rank) << 32) ^ i));
  return b;
}

inline ::testing::AssertionResult sameBytes(const void* got, const void* want, size_t bytes) {
  if (bytes == 0 || std::memcmp(got, want, bytes) == 0) return ::testing::AssertionSuccess();
  const auto* g = static_cast<const unsigned char*>(got);
  const auto* w = static_cast<const unsigned char*>(want);
  size_t i = 0;
  while (g[i] == w[i]) ++i;
  return ::testing::AssertionFailure()
         << "first difference at byte " << i << " of " << bytes << ": got 0x" << std::hex
         << int{g[i]} << ", want 0x" << int{w[i]};
}

// Collects one completion per rank; waits are bounded.
class Completions {
 public:
  explicit Completions(int n) : statuses_(n), done_(n, false), left_(n) {}

  Backend::Done slot(int rank, std::shared_ptr<Completions> self) {
    return [self, rank](Status s) {
      std::lock_guard<std::mutex> lock(self->mu_);
      if (self->done_[rank]) return;
      self->statuses_[rank] = std::move(s);
      self->done_[rank] = true;
      --self->left_;
      self->cv_.notify_all();
    };
  }

  // Statuses after every rank completed, or TimedOut("no completion") for the missing ones.
  std::vector<Status> wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return left_ == 0; });
    std::vector<Status> out = statuses_;
    for (size_t r = 0; r < out.size(); ++r) {
      if (!done_[r]) out[r] = timedOut("rank " + std::to_string(r) + ": no completion");
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> statuses_;
  std::vector<bool> done_;
  int left_;
};

// `size` backends of one kind as threads of this process, over an in-memory store.
class PeerGroup {
 public:
  using Post = std::function<void(int rank, Backend& backend, Backend::Done done)>;

  static StatusOr<std::unique_ptr<PeerGroup>> create(const std::string& backend, int size,
                                                     const BackendOptions& base) {
    auto group = std::unique_ptr<PeerGroup>(new PeerGroup());
    group->backends_.resize(size);
    std::vector<Status> statuses(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        BackendOptions o = base;
        o.rank = r;
        o.size = size;
        o.name = "test/r" + std::to_string(r);
        auto b = createBackend(backend, o, group->kv_);
        if (b.isOk()) {
          group->backends_[r] = std::move(b).value();
        } else {
          statuses[r] = b.status();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& s : statuses) {
      if (!s.isOk()) return s;
    }
    return group;
  }

  int size() const { return static_cast<int>(backends_.size()); }
  Backend& at(int r) { return *backends_[r]; }
  void destroy(int r) { backends_[r].reset(); }

  // Posts on every rank and waits (bounded) for all the completions.
  std::vector<Status> run(const Post& post, std::chrono::milliseconds timeout = 60s) {
    auto c = std::make_shared<Completions>(size());
    for (int r = 0; r < size(); ++r) post(r, at(r), c->slot(r, c));
    return c->wait(timeout);
  }

 private:
  PeerGroup() = default;
  InMemoryKvStore kv_;
  std::vector<std::unique_ptr<Backend>> backends_;
};

inline ::testing::AssertionResult allOk(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (!statuses[r].isOk()) {
      return ::testing::AssertionFailure() << "rank " << r << ": " << statuses[r].toString();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kolo::testing_backend
