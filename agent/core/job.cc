#include "agent/core/job.h"

namespace kolo {

const char* jobStateName(JobState s) {
  switch (s) {
    case JobState::kForming: return "forming";
    case JobState::kRunning: return "running";
    case JobState::kFailed: return "failed";
    case JobState::kEnding: return "ending";
  }
  return "?";
}

Job::Job(std::string id, std::string token, int world_size, int local_size)
    : id_(std::move(id)),
      token_(std::move(token)),
      world_size_(world_size),
      local_size_(local_size),
      table_(local_size),
      clients_(local_size, nullptr),
      ever_connected_(local_size, false) {}

int Job::connectedClients() const {
  int n = 0;
  for (auto* c : clients_) n += c != nullptr;
  return n;
}

void Job::setWorld(const JobWorld& w) {
  world_ = w;
  table_.setRankOffset(w.rank_offset);
  if (state_ == JobState::kForming) state_ = JobState::kRunning;
}

void Job::fail(Status st) {
  if (state_ == JobState::kFailed) return;
  state_ = JobState::kFailed;
  failure_ = std::move(st);
}

void Job::setEnding(Status st) {
  if (state_ == JobState::kFailed || state_ == JobState::kEnding) return;
  state_ = JobState::kEnding;
  failure_ = std::move(st);
}

}  // namespace kolo
