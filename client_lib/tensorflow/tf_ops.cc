// The kolo TensorFlow ops' definitions (Horovod's HorovodAllreduce & co.,
// horovod/tensorflow/mpi_ops.cc, under kolo's names). Kernels: tf_kernels.cc.
//
// Every collective takes `tensor_name` (empty: the kernel's node name, the
// same on every rank when every rank builds the same graph, as with
// Horovod), `ignore_name_scope` (keep only the last component of the node
// name) and `process_set_id` (0: every rank).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace kolo::tf {
namespace {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

#define KOLO_COMMON_ATTRS                      \
  Attr("tensor_name: string = ''")             \
      .Attr("ignore_name_scope: bool = false") \
      .Attr("process_set_id: int = 0")

constexpr char kReduceTypes[] = "T: {half, bfloat16, float, double, int8, uint8, int32, int64}";
constexpr char kAnyTypes[] = "T: {half, bfloat16, float, double, int8, uint8, int32, int64, bool}";
constexpr char kReduceListTypes[] =
    "T: list({half, bfloat16, float, double, int8, uint8, int32, int64})";
constexpr char kAnyListTypes[] =
    "T: list({half, bfloat16, float, double, int8, uint8, int32, int64, bool})";

// Output i has input i's shape with an unknown first dimension.
Status FirstDimUnknown(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) {
    ShapeHandle in = c->input(i);
    ShapeHandle out;
    TF_RETURN_IF_ERROR(c->WithRankAtLeast(in, 1, &in));
    TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
    c->set_output(i, out);
  }
  return Status();
}

Status SameAsInputs(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
  return Status();
}

}  // namespace

REGISTER_OP("KoloAllreduce")
    .Attr(kReduceTypes)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .KOLO_COMMON_ATTRS.Input("tensor: T")
    .Output("sum: T")
    .SetShapeFn(SameAsInputs)
    .Doc(
        "Reduces `tensor` over the ranks of the process set (reduce_op: 0 Average, 1 Sum, 3 Min, 4 "
        "Max, "
        "5 Product; Horovod's numbering).");

REGISTER_OP("KoloGroupedAllreduce")
    .Attr(kReduceListTypes)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .KOLO_COMMON_ATTRS.Input("tensors: T")
    .Output("sums: T")
    .SetShapeFn(SameAsInputs)
    .Doc(
        "KoloAllreduce of every tensor, negotiated and fused as one group (member i is named "
        "<name>_<i>).");

REGISTER_OP("KoloAllgather")
    .Attr(kAnyTypes)
    .KOLO_COMMON_ATTRS.Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(FirstDimUnknown)
    .Doc(
        "Concatenates every rank's `tensor` along the first dimension (which may differ), in rank "
        "order.");

REGISTER_OP("KoloGroupedAllgather")
    .Attr(kAnyListTypes)
    .KOLO_COMMON_ATTRS.Input("tensors: T")
    .Output("outputs: T")
    .SetShapeFn(FirstDimUnknown)
    .Doc("KoloAllgather of every tensor as one group.");

REGISTER_OP("KoloBroadcast")
    .Attr(kAnyTypes)
    .Attr("root_rank: int")
    .KOLO_COMMON_ATTRS.Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(SameAsInputs)
    .Doc("The tensor of global rank `root_rank`, on every rank.");

REGISTER_OP("KoloAlltoall")
    .Attr(kAnyTypes)
    .KOLO_COMMON_ATTRS.Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle in = c->input(0);
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(in, 1, &in));
      TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      c->set_output(1, c->Vector(c->UnknownDim()));
      return Status();
    })
    .Doc(
        "Sends splits[d] rows to rank d (empty splits: even) and returns the rows received, with "
        "their splits.");

REGISTER_OP("KoloReducescatter")
    .Attr(kReduceTypes)
    .Attr("reduce_op: int")
    .KOLO_COMMON_ATTRS.Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(FirstDimUnknown)
    .Doc(
        "Reduces `tensor` and keeps this rank's block of rows (the first dim % size ranks get one "
        "more).");

REGISTER_OP("KoloGroupedReducescatter")
    .Attr(kReduceListTypes)
    .Attr("reduce_op: int")
    .KOLO_COMMON_ATTRS.Input("tensors: T")
    .Output("outputs: T")
    .SetShapeFn(FirstDimUnknown)
    .Doc("KoloReducescatter of every tensor as one group.");

REGISTER_OP("KoloBarrier")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Returns once every rank of the process set has entered it.");

REGISTER_OP("KoloJoin")
    .Output("last_joined_rank: int32")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(
        "Horovod's join: this rank takes no more part; returns the last rank to join once all "
        "have.");

}  // namespace kolo::tf
