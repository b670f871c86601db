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

}  // namespace kolo::coordinator
