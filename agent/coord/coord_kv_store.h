// The backends' rendezvous store over the coordinator's job-scoped KV.
#pragma once

#include "agent/backends/kv_store.h"
#include "agent/coord/coord_client.h"

namespace kolo {

class CoordKvStore final : public KvStore {
 public:
  CoordKvStore(CoordClient& coord, std::string job_id, std::string token)
      : coord_(coord), job_id_(std::move(job_id)), token_(std::move(token)) {}
  Status put(const std::string& key, std::string_view value) override {
    return coord_.kvPut(job_id_, token_, key, std::string(value));
  }
  StatusOr<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return coord_.kvGet(job_id_, token_, key, timeout);
  }

 private:
  CoordClient& coord_;
  std::string job_id_;
  std::string token_;
};

}  // namespace kolo
