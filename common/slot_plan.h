// Where one submission's pieces go in a client's shared data region: the
// pure half of libkolo's submit path (OpArgs -> slot plan -> copy-in ->
// publish; docs/architecture.md, "One submission in libkolo").
//
// planSlots() takes a validated op (SlotRequest) and the arena's geometry
// and says how big a slot to allocate (0: none), where in it (or, zero
// copy, where in the arena) the input, the header (allgather's first
// dimensions, alltoall's split matrix), the output region and the result
// lie, and how the input gets there. describeSubmit() turns a plan and the
// slot's offset into the SubmitDesc fields (all but handle and
// generation). No I/O, no shared memory: ipc_layout.h is the contract,
// this is the arithmetic on it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/dtype.h"
#include "common/ipc_layout.h"
#include "common/status.h"

namespace kolo {

// "broadcast of tensor 'x'" (the name cut at 64 bytes): how errors name an op.
std::string describeTensor(CollectiveType collective, std::string_view name);

struct SlotRequest {
  CollectiveType collective = CollectiveType::kAllreduce;
  std::string_view name;
  DataType dtype = DataType::kFloat32;  // the wire dtype (compressed: float16/bfloat16)
  ReduceOp op = ReduceOp::kSum;
  int ndim = 0;
  const int64_t* shape = nullptr;  // ndim entries
  int root = -1;                   // broadcast only
  double prescale = 1.0;
  double postscale = 1.0;
  uint64_t bytes = 0;  // the input's bytes (validated)
  // Arena offsets of the input and the output when they lie in the data
  // region (kolo_alloc_shared buffers), else empty.
  std::optional<uint64_t> input_offset;
  std::optional<uint64_t> output_offset;
  bool has_output = false;                 // the caller gave an output buffer
  bool out_of_place = false;               // never work in place on the input
  bool compressed = false;                 // float32 input converted to `dtype`
  // The input's and the output's addresses in this process (the direct
  // path, see SlotGeometry::direct_min_bytes); 0: unknown.
  uint64_t input_addr = 0;
  uint64_t output_addr = 0;
  const int64_t* gather_dims = nullptr;    // allgather: int64[size]
  const int64_t* splits_matrix = nullptr;  // alltoall: int64[size][size]
  uint64_t group_id = 0;
  uint64_t group_hash = 0;
  uint32_t group_size = 0;
};

struct SlotGeometry {
  const std::map<uint64_t, uint64_t>* shared = nullptr;  // kolo_alloc_shared: offset -> bytes
  int rank = 0;
  int size = 1;
  // Direct user memory (ipc_layout.h kSubmitFlagUserMemory): > 0 when the
  // agent reads and writes this process's tensors in place; an allreduce
  // of at least this many bytes outside the arena then takes no slot.
  uint64_t direct_min_bytes = 0;
};

// How the input reaches the plan's input piece.
enum class CopyIn : uint8_t {
  kNone,        // zero copy (or nothing to copy)
  kPlain,       // the input's bytes
  kToFloat16,   // float32 -> float16 (compressed allreduce)
  kToBFloat16,  // float32 -> bfloat16
};

// A piece of the data region: `at` is relative to the slot when in_slot,
// else an absolute arena offset.
struct SlotPiece {
  uint64_t at = 0;
  uint64_t bytes = 0;
  bool in_slot = false;
  uint64_t offset(uint64_t slot_offset) const { return in_slot ? slot_offset + at : at; }
};

struct SlotPlan {
  uint64_t slot_bytes = 0;  // to allocate in the data region; 0: no slot
  SlotPiece input;          // SubmitDesc data_offset / data_bytes
  SlotPiece out;            // SubmitDesc out_offset / out_bytes (0/0: in place)
  SlotPiece header;         // the int64 header the client writes (bytes 0: none)
  const int64_t* header_src = nullptr;
  std::optional<SlotPiece> result;  // where the result is read at completion
  uint64_t result_bytes = 0;
  CopyIn copy = CopyIn::kNone;
  bool gather = false;        // allgather / alltoall: the result is library-owned
  int64_t gather_dim0 = 0;    // the result's first dimension
  bool shared_input = false;  // zero copy out of place: the input stays busy too
  // Direct: input and out are addresses in this process (absolute pieces),
  // the agent writes the result into the output itself (no result piece).
  bool direct = false;
};

// Errors: InvalidArgument naming the op (describeTensor) when the buffers
// cannot be used as given (a reducescatter without output, a zero-copy
// tensor that does not lie in one kolo_alloc_shared buffer, an output that
// overlaps the input).
StatusOr<SlotPlan> planSlots(const SlotRequest& r, const SlotGeometry& g);

// The descriptor for `plan` placed at `slot_offset` (ignored without a
// slot); handle and generation are the publisher's.
SubmitDesc describeSubmit(const SlotRequest& r, const SlotPlan& plan, uint64_t slot_offset);

}  // namespace kolo
