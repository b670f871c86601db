// CLI11 validators for numeric flags whose message says what is wanted
// ("--np: must be a whole number of at least 1, got 0") instead of CLI11's
// "Value 0 not in range 0.000000 to 1797693134862315708...".
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

namespace kolo::cli {

inline CLI::Validator numberAbove(double floor, bool inclusive, const char* what) {
  return CLI::Validator(
      [floor, inclusive, what](std::string& v) -> std::string {
        double d = 0;
        if (!CLI::detail::lexical_cast(v, d) || std::isnan(d) ||
            (inclusive ? d < floor : d <= floor)) {
          return std::string("must be ") + what + ", got '" + v + "'";
        }
        return std::string();
      },
      "", "");
}

// > 0 (ranks, seconds, agents).
inline CLI::Validator positive() { return numberAbove(0, false, "a number greater than 0"); }
// >= 0 (0 usually meaning "off" or "no limit").
inline CLI::Validator nonNegative() { return numberAbove(0, true, "a number of 0 or more"); }

}  // namespace kolo::cli
