#include "common/dtype.h"

namespace kolo {

size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kFloat32:
    case DataType::kInt32: return 4;
    case DataType::kFloat64:
    case DataType::kInt64: return 8;
    case DataType::kInt8:
    case DataType::kUint8: return 1;
  }
  return 0;
}

std::string_view dataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
  return "unknown";
}

std::string_view reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "unknown";
}

std::string_view collectiveName(CollectiveType c) {
  switch (c) {
    case CollectiveType::kAllreduce: return "allreduce";
    case CollectiveType::kAllgather: return "allgather";
    case CollectiveType::kBroadcast: return "broadcast";
    case CollectiveType::kAlltoall: return "alltoall";
    case CollectiveType::kReducescatter: return "reducescatter";
    case CollectiveType::kBarrier: return "barrier";
    case CollectiveType::kJoin: return "join";
  }
  return "unknown";
}

bool isValidDataType(int v) { return v >= 0 && v < kNumDataTypes; }
bool isValidReduceOp(int v) { return v == 0 || v == 1 || (v >= 3 && v <= 5); }
bool isValidCollective(int v) { return v >= 0 && v <= 6; }

std::optional<DataType> parseDataType(std::string_view s) {
  for (int i = 0; i < kNumDataTypes; ++i) {
    if (dataTypeName(static_cast<DataType>(i)) == s) return static_cast<DataType>(i);
  }
  if (s == "half") return DataType::kFloat16;
  if (s == "float") return DataType::kFloat32;
  if (s == "double") return DataType::kFloat64;
  return std::nullopt;
}

std::optional<ReduceOp> parseReduceOp(std::string_view s) {
  for (int v : {0, 1, 3, 4, 5}) {
    if (reduceOpName(static_cast<ReduceOp>(v)) == s) return static_cast<ReduceOp>(v);
  }
  return std::nullopt;
}

}  // namespace kolo
