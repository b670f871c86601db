#include "coordinator/membership/secrets.h"

#include <openssl/sha.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <random>

namespace kolo::coordinator {

bool constantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string newAgentSecret() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    got += static_cast<size_t>(n);
  }
  if (got < sizeof bytes) {  // no getrandom (very old kernel): the C++ library's source
    std::random_device rd;
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(rd());
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof bytes);
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

namespace {
constexpr std::string_view kHashPrefix = "sha256:";
}  // namespace

std::string hashSecret(std::string_view raw) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(raw.data()), raw.size(), digest);
  static const char kHex[] = "0123456789abcdef";
  std::string out(kHashPrefix);
  for (unsigned char b : digest) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

bool isHashedSecret(std::string_view s) {
  return s.size() == kHashPrefix.size() + 2 * SHA256_DIGEST_LENGTH &&
         s.substr(0, kHashPrefix.size()) == kHashPrefix;
}

std::string storedSecret(std::string_view s) {
  return isHashedSecret(s) ? std::string(s) : hashSecret(s);
}

bool matchesStored(std::string_view presented, std::string_view stored) {
  return constantTimeEquals(hashSecret(presented), stored);
}

}  // namespace kolo::coordinator
