// Element types, reduction ops and collective kinds shared by agent and client.
// Numeric values are part of the C ABI and the shared-memory descriptors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kolo {

enum class DataType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUint8 = 5,
  kInt32 = 6,
  kInt64 = 7,
};
constexpr int kNumDataTypes = 8;

// Horovod's numbering (Adasum = 2 is not supported).
enum class ReduceOp : uint8_t {
  kAverage = 0,
  kSum = 1,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

enum class CollectiveType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
};

size_t dataTypeSize(DataType t);
std::string_view dataTypeName(DataType t);      // "float32"
std::string_view reduceOpName(ReduceOp op);     // "sum"
std::string_view collectiveName(CollectiveType c);  // "allreduce"
bool isValidDataType(int v);
bool isValidReduceOp(int v);
bool isValidCollective(int v);
std::optional<DataType> parseDataType(std::string_view s);
std::optional<ReduceOp> parseReduceOp(std::string_view s);

}  // namespace kolo
