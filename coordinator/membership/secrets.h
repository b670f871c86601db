// Credentials of the coordinator's callers: comparing them without timing
// leaks, and minting the per-registration agent secret.
#pragma once

#include <string>
#include <string_view>

namespace kolo::coordinator {

// Equal contents, compared without an early exit: the time taken does not
// tell how much of a guessed token or secret was right (only, at most,
// whether its length was).
bool constantTimeEquals(std::string_view a, std::string_view b);

// 128 random bits from the kernel (getrandom), as 32 hex digits.
std::string newAgentSecret();

// Issue 47: agent secrets and job tokens are held, journaled and written to
// etcd only as "sha256:<64 hex digits>" of the value, so the state dir and
// etcd hold nothing a caller can present. (Secrets are 128 random bits and
// job tokens come from kolorun's random source, so an unsalted hash is
// enough: nothing to brute-force from it.)
std::string hashSecret(std::string_view raw);
bool isHashedSecret(std::string_view s);
// The stored form of `s`: `s` if it is a hash already (this coordinator
// wrote it), else its hash (a state written before issue 47).
std::string storedSecret(std::string_view s);
// `presented` (what a caller sent) is the secret whose stored form is
// `stored`; constant time.
bool matchesStored(std::string_view presented, std::string_view stored);

}  // namespace kolo::coordinator
