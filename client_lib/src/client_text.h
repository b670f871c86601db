// Small text helpers shared by the Client's files (not part of the API).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace kolo::client_text {

// Seconds with one decimal, for error messages ("did not complete within 1.5 s").
inline std::string fmtSeconds(std::chrono::steady_clock::duration d) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f",
                std::chrono::duration_cast<std::chrono::duration<double>>(d).count());
  return b;
}

// 'name', cut at 64 bytes.
inline std::string quoteName(std::string_view name) {
  constexpr size_t kShown = 64;
  std::string q = "'";
  q.append(name.substr(0, kShown));
  q.append(name.size() > kShown ? "...'" : "'");
  return q;
}

// A status code received from the agent. 0 and values outside the enum become
// `fallback` (the agent is another program: do not trust it blindly).
inline Status wireStatus(int32_t code, std::string message, Code fallback) {
  Code c = (code >= 2 && code <= 9) ? static_cast<Code>(code) : fallback;
  if (message.empty()) message = std::string("the kolo agent reported ") + codeName(c);
  return Status(c, std::move(message));
}

}  // namespace kolo::client_text
