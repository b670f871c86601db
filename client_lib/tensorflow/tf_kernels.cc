// The kolo TensorFlow ops' kernels (definitions: tf_ops.cc). Each is an
// AsyncOpKernel over libkolo's C ABI: it submits the collective and returns;
// the waiter thread (tf_waiter.h) calls `done` once the result is in the
// output. CPU kernels only: TensorFlow places the ops on the host and copies
// GPU tensors there and back (docs/tensorflow.md, "GPU tensors").
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kolo/kolo_c.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tf_waiter.h"

namespace kolo::tf {
namespace {

namespace tfw = ::tensorflow;
using tfw::AsyncOpKernel;
using tfw::OpKernelConstruction;
using tfw::OpKernelContext;
using tfw::Tensor;
using tfw::TensorShape;
using Status = ::tensorflow::Status;

bool ToKolo(tfw::DataType t, kolo_dtype_t* out) {
  switch (t) {
    case tfw::DT_HALF:
      *out = KOLO_FLOAT16;
      return true;
    case tfw::DT_BFLOAT16:
      *out = KOLO_BFLOAT16;
      return true;
    case tfw::DT_FLOAT:
      *out = KOLO_FLOAT32;
      return true;
    case tfw::DT_DOUBLE:
      *out = KOLO_FLOAT64;
      return true;
    case tfw::DT_INT8:
      *out = KOLO_INT8;
      return true;
    case tfw::DT_UINT8:
      *out = KOLO_UINT8;
      return true;
    case tfw::DT_BOOL:
      *out = KOLO_UINT8;
      return true;  // one byte; never reduced (op definitions)
    case tfw::DT_INT32:
      *out = KOLO_INT32;
      return true;
    case tfw::DT_INT64:
      *out = KOLO_INT64;
      return true;
    default:
      return false;
  }
}

std::vector<int64_t> Dims(const TensorShape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.dims(); ++i) d.push_back(s.dim_size(i));
  return d;
}

// The error a failed collective surfaces as: the op, the tensor and the cause.
Status Failure(const std::string& what, const std::string& name, kolo_status_t st,
               const std::string& err) {
  std::string msg =
      "kolo " + what + " of tensor '" + name + "' failed (" + kolo_status_string(st) + "): " + err;
  switch (st) {
    case KOLO_ERR_INVALID_ARGUMENT:
      return tfw::errors::InvalidArgument(msg);
    case KOLO_ERR_TIMED_OUT:
      return tfw::errors::DeadlineExceeded(msg);
    case KOLO_ERR_ABORTED:
    case KOLO_ERR_MEMBERSHIP_CHANGED:
      return tfw::errors::Aborted(msg);
    case KOLO_ERR_UNAVAILABLE:
    case KOLO_ERR_PEER_FAILURE:
      return tfw::errors::Unavailable(msg);
    case KOLO_ERR_PERMISSION_DENIED:
      return tfw::errors::PermissionDenied(msg);
    default:
      return tfw::errors::Internal(msg);
  }
}

int SetSize(int ps) { return ps == 0 ? kolo_size() : kolo_process_set_size(ps); }
int SetRank(int ps) { return ps == 0 ? kolo_rank() : kolo_process_set_rank(ps); }

// Rows of `d0` that the set's rank `r` of `n` keeps (reducescatter).
int64_t BlockRows(int64_t d0, int n, int r) { return d0 / n + (r < d0 % n ? 1 : 0); }

class KoloKernel : public AsyncOpKernel {
 public:
  KoloKernel(OpKernelConstruction* c, const char* what) : AsyncOpKernel(c), what_(what) {
    bool ignore_scope = false;
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &name_));
    OP_REQUIRES_OK(c, c->GetAttr("ignore_name_scope", &ignore_scope));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &ps_));
    if (name_.empty()) name_ = name();
    if (ignore_scope && name_.find('/') != std::string::npos)
      name_ = name_.substr(name_.rfind('/') + 1);
  }

 protected:
  // Checks what every kernel needs before it submits.
  Status Precheck(OpKernelContext* ctx) const {
    if (!kolo_is_initialized()) {
      return tfw::errors::FailedPrecondition("kolo ", what_, " of tensor '", name_,
                                             "': kolo has not been initialized; call "
                                             "kolo.tensorflow.init() (hvd.init()) first");
    }
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      kolo_dtype_t dt;
      if (ctx->input_dtype(i) != tfw::DT_INT32 || i == 0) {
        if (!ToKolo(ctx->input_dtype(i), &dt)) {
          return tfw::errors::InvalidArgument("kolo ", what_, " of tensor '", name_, "': dtype ",
                                              tfw::DataTypeString(ctx->input_dtype(i)),
                                              " is not supported");
        }
      }
    }
    return Status();
  }
  Status Submitted(kolo_status_t st) const {
    return st == KOLO_OK ? Status() : Failure(what_, name_, st, LastError(st));
  }
  std::string Member(int i) const { return name_ + "_" + std::to_string(i); }
  // Watches `hs`; on failure the op's status names the tensor.
  void Finish(OpKernelContext* ctx, DoneCallback done, std::vector<kolo_handle_t> hs) const {
    std::string what = what_, name = name_;
    WatchHandles(std::move(hs), false,
                 [ctx, done, what, name](kolo_status_t st, const std::string& err) {
                   if (st != KOLO_OK) ctx->SetStatus(Failure(what, name, st, err));
                   done();
                 });
  }

  std::string what_;
  std::string name_;
  int ps_ = 0;
};

class AllreduceOp : public KoloKernel {
 public:
  explicit AllreduceOp(OpKernelConstruction* c) : KoloKernel(c, "allreduce") { ReadReduceAttrs(c); }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, Precheck(ctx), done);
    const int n = ctx->num_inputs();
    std::vector<const void*> ins(n);
    std::vector<void*> outs(n);
    std::vector<std::vector<int64_t>> dims(n);
    std::vector<const int64_t*> shapes(n);
    std::vector<int> ndims(n);
    std::vector<kolo_dtype_t> dts(n);
    std::vector<std::string> names(n);
    std::vector<const char*> cnames(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& in = ctx->input(i);
      Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({i}, i, in.shape(), &out),
                           done);
      ins[i] = in.tensor_data().data();
      outs[i] = const_cast<char*>(out->tensor_data().data());
      dims[i] = Dims(in.shape());
      shapes[i] = dims[i].data();
      ndims[i] = static_cast<int>(dims[i].size());
      ToKolo(in.dtype(), &dts[i]);
      names[i] = n == 1 && !grouped_ ? name_ : Member(i);
      cnames[i] = names[i].c_str();
    }
    std::vector<kolo_handle_t> hs(n, 0);
    kolo_status_t st;
    if (grouped_) {
      st = kolo_ps_grouped_allreduce_async(ps_, n, cnames.data(), ins.data(), outs.data(),
                                           ndims.data(), shapes.data(), dts.data(), op_, pre_,
                                           post_, hs.data());
    } else {
      st = kolo_ps_allreduce_async(ps_, cnames[0], ins[0], outs[0], ndims[0], shapes[0], dts[0],
                                   op_, pre_, post_, hs.data());
    }
    OP_REQUIRES_OK_ASYNC(ctx, Submitted(st), done);
    Finish(ctx, std::move(done), std::move(hs));
  }

 protected:
  void ReadReduceAttrs(OpKernelConstruction* c) {
    int op = 0;
    float pre = 1, post = 1;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &pre));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &post));
    OP_REQUIRES(c,
                op == KOLO_AVERAGE || op == KOLO_SUM || op == KOLO_MIN || op == KOLO_MAX ||
                    op == KOLO_PRODUCT,
                tfw::errors::InvalidArgument(
                    "kolo allreduce of tensor '", name_, "': reduce_op ", op,
                    " is not one of Average (0), Sum (1), Min (3), Max (4), Product (5)",
                    op == 2 ? " (Adasum is not supported by kolo.tensorflow)" : ""));
    op_ = static_cast<kolo_op_t>(op);
    pre_ = pre;
    post_ = post;
    grouped_ = type_string() == "KoloGroupedAllreduce";
  }

  kolo_op_t op_ = KOLO_SUM;
  double pre_ = 1, post_ = 1;
  bool grouped_ = false;
};

class BroadcastOp : public KoloKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* c) : KoloKernel(c, "broadcast") {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, Precheck(ctx), done);
    const Tensor& in = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, in.shape(), &out), done);
    kolo_dtype_t dt;
    ToKolo(in.dtype(), &dt);
    auto dims = Dims(in.shape());
    kolo_handle_t h = 0;
    kolo_status_t st = kolo_ps_broadcast_oop_async(
        ps_, name_.c_str(), in.tensor_data().data(), const_cast<char*>(out->tensor_data().data()),
        static_cast<int>(dims.size()), dims.data(), dt, root_, &h);
    OP_REQUIRES_OK_ASYNC(ctx, Submitted(st), done);
    Finish(ctx, std::move(done), {h});
  }

 private:
  int root_ = 0;
};

// Copies the library-owned result of handle `h` (allgather, alltoall) into
// a new output `index` of shape (rows, tail...), then releases `h`.
Status TakeResult(OpKernelContext* ctx, int index, kolo_handle_t h, const TensorShape& like) {
  void* data = nullptr;
  int64_t dim0 = 0;
  kolo_status_t st = kolo_result(h, &data, &dim0);
  if (st != KOLO_OK) {
    std::string err = LastError(st);
    kolo_release(h);
    return tfw::errors::Internal("kolo_result: ", err);
  }
  TensorShape shape = like;
  shape.set_dim(0, dim0);
  Tensor* out = nullptr;
  Status s = ctx->allocate_output(index, shape, &out);
  if (s.ok() && out->TotalBytes() > 0)
    std::memcpy(const_cast<char*>(out->tensor_data().data()), data, out->TotalBytes());
  kolo_release(h);
  return s;
}

class AllgatherOp : public KoloKernel {
 public:
  explicit AllgatherOp(OpKernelConstruction* c) : KoloKernel(c, "allgather") {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, Precheck(ctx), done);
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      OP_REQUIRES_ASYNC(
          ctx, ctx->input(i).dims() >= 1,
          tfw::errors::InvalidArgument("kolo allgather of tensor '", name_,
                                       "': a tensor of rank >= 1 is needed, got a scalar"),
          done);
    }
    bool grouped = type_string() == "KoloGroupedAllgather";
    std::string what = what_, name = name_;
    int ps = ps_;
    RunDetached([ctx, done, grouped, what, name, ps, this] {
      const int n = ctx->num_inputs();
      std::vector<std::vector<int64_t>> dims(n);
      std::vector<const int64_t*> shapes(n);
      std::vector<const void*> ins(n);
      std::vector<int> ndims(n);
      std::vector<kolo_dtype_t> dts(n);
      std::vector<std::string> names(n);
      std::vector<const char*> cnames(n);
      for (int i = 0; i < n; ++i) {
        dims[i] = Dims(ctx->input(i).shape());
        shapes[i] = dims[i].data();
        ndims[i] = static_cast<int>(dims[i].size());
        ins[i] = ctx->input(i).tensor_data().data();
        ToKolo(ctx->input(i).dtype(), &dts[i]);
        names[i] = grouped ? Member(i) : name;
        cnames[i] = names[i].c_str();
      }
      std::vector<kolo_handle_t> hs(n, 0);
      kolo_status_t st =
          grouped ? kolo_ps_grouped_allgather_async(ps, n, cnames.data(), ins.data(), ndims.data(),
                                                    shapes.data(), dts.data(), hs.data())
                  : kolo_ps_allgather_async(ps, cnames[0], ins[0], ndims[0], shapes[0], dts[0],
                                            hs.data());
      if (st != KOLO_OK) {
        ctx->SetStatus(Failure(what, name, st, LastError(st)));
        done();
        return;
      }
      WatchHandles(hs, true, [ctx, done, hs, what, name](kolo_status_t st, const std::string& err) {
        if (st != KOLO_OK) {
          ctx->SetStatus(Failure(what, name, st, err));
        } else {
          for (size_t i = 0; i < hs.size(); ++i) {
            Status s = TakeResult(ctx, static_cast<int>(i), hs[i], ctx->input(i).shape());
            if (!s.ok()) ctx->SetStatus(s);
          }
        }
        done();
      });
    });
  }
};

class AlltoallOp : public KoloKernel {
 public:
  explicit AlltoallOp(OpKernelConstruction* c) : KoloKernel(c, "alltoall") {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, Precheck(ctx), done);
    const Tensor& in = ctx->input(0);
    const Tensor& sp = ctx->input(1);
    const int n = SetSize(ps_), r = SetRank(ps_);
    OP_REQUIRES_ASYNC(ctx, in.dims() >= 1,
                      tfw::errors::InvalidArgument("kolo alltoall of tensor '", name_,
                                                   "': a scalar cannot be split"),
                      done);
    OP_REQUIRES_ASYNC(ctx, n > 0 && r >= 0,
                      tfw::errors::InvalidArgument("kolo alltoall of tensor '", name_,
                                                   "': this rank is not in process set ", ps_),
                      done);
    const int64_t d0 = in.dim_size(0);
    auto splits = std::make_shared<std::vector<int64_t>>();
    if (sp.NumElements() == 0) {
      OP_REQUIRES_ASYNC(
          ctx, d0 % n == 0,
          tfw::errors::InvalidArgument("kolo alltoall of tensor '", name_,
                                       "': without splits the first dimension (", d0,
                                       ") must divide evenly by the number of ranks (", n, ")"),
          done);
      splits->assign(n, d0 / n);
    } else {
      OP_REQUIRES_ASYNC(ctx, sp.dims() == 1 && sp.NumElements() == n,
                        tfw::errors::InvalidArgument("kolo alltoall of tensor '", name_,
                                                     "': splits has ", sp.NumElements(),
                                                     " entries; it needs one per rank (", n, ")"),
                        done);
      int64_t sum = 0;
      for (int i = 0; i < n; ++i) {
        int64_t v = sp.flat<int32_t>()(i);
        OP_REQUIRES_ASYNC(ctx, v >= 0,
                          tfw::errors::InvalidArgument("kolo alltoall of tensor '", name_,
                                                       "': negative split ", v),
                          done);
        splits->push_back(v);
        sum += v;
      }
      OP_REQUIRES_ASYNC(ctx, sum <= d0,
                        tfw::errors::InvalidArgument(
                            "kolo alltoall of tensor '", name_, "': the splits add up to ", sum,
                            " rows, more than the first dimension (", d0, ")"),
                        done);
    }
    // Row r of the set's n x n split matrix, summed over the ranks: column r
    // is then what every rank sends here (the received splits).
    auto matrix = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(n) * n, 0);
    std::copy(splits->begin(), splits->end(), matrix->begin() + static_cast<size_t>(r) * n);
    const int64_t mshape[2] = {n, n};
    kolo_handle_t hm = 0;
    std::string mname = name_ + ".__recv_splits";
    kolo_status_t st = kolo_ps_allreduce_async(ps_, mname.c_str(), matrix->data(), matrix->data(),
                                               2, mshape, KOLO_INT64, KOLO_SUM, 1.0, 1.0, &hm);
    OP_REQUIRES_OK_ASYNC(ctx, Submitted(st), done);
    std::string what = what_, name = name_;
    int ps = ps_;
    RunDetached([ctx, done, what, name, ps, splits, matrix, hm, n, r] {
      const Tensor& in = ctx->input(0);
      auto dims = Dims(in.shape());
      int64_t sent = 0;
      for (int64_t v : *splits) sent += v;
      dims[0] = sent;
      kolo_dtype_t dt;
      ToKolo(in.dtype(), &dt);
      kolo_handle_t ha = 0;
      kolo_status_t st = kolo_ps_alltoall_async(ps, name.c_str(), in.tensor_data().data(),
                                                static_cast<int>(dims.size()), dims.data(), dt,
                                                splits->data(), &ha);
      if (st != KOLO_OK) {
        ctx->SetStatus(Failure(what, name, st, LastError(st)));
        kolo_synchronize(hm, -1);
        done();
        return;
      }
      WatchHandles(
          {hm, ha}, true,
          [ctx, done, what, name, matrix, ha, n, r](kolo_status_t st, const std::string& err) {
            if (st != KOLO_OK) {
              ctx->SetStatus(Failure(what, name, st, err));
              done();
              return;
            }
            Status s = TakeResult(ctx, 0, ha, ctx->input(0).shape());
            Tensor* recv = nullptr;
            if (s.ok()) s = ctx->allocate_output(1, TensorShape({n}), &recv);
            if (s.ok()) {
              for (int i = 0; i < n; ++i)
                recv->flat<int32_t>()(i) =
                    static_cast<int32_t>((*matrix)[static_cast<size_t>(i) * n + r]);
            }
            if (!s.ok()) ctx->SetStatus(s);
            done();
          });
    });
  }
};

class ReducescatterOp : public KoloKernel {
 public:
  explicit ReducescatterOp(OpKernelConstruction* c) : KoloKernel(c, "reducescatter") {
    int op = 0;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    op_ = static_cast<kolo_op_t>(op);
    grouped_ = type_string() == "KoloGroupedReducescatter";
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, Precheck(ctx), done);
    const int n = ctx->num_inputs(), size = SetSize(ps_), rank = SetRank(ps_);
    OP_REQUIRES_ASYNC(ctx, size > 0 && rank >= 0,
                      tfw::errors::InvalidArgument("kolo reducescatter of tensor '", name_,
                                                   "': this rank is not in process set ", ps_),
                      done);
    std::vector<std::vector<int64_t>> dims(n);
    std::vector<const int64_t*> shapes(n);
    std::vector<const void*> ins(n);
    std::vector<void*> outs(n);
    std::vector<int> ndims(n);
    std::vector<kolo_dtype_t> dts(n);
    std::vector<std::string> names(n);
    std::vector<const char*> cnames(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& in = ctx->input(i);
      OP_REQUIRES_ASYNC(ctx, in.dims() >= 1,
                        tfw::errors::InvalidArgument("kolo reducescatter of tensor '", name_,
                                                     "': a scalar cannot be scattered"),
                        done);
      TensorShape oshape = in.shape();
      oshape.set_dim(0, BlockRows(in.dim_size(0), size, rank));
      Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, oshape, &out), done);
      dims[i] = Dims(in.shape());
      shapes[i] = dims[i].data();
      ndims[i] = static_cast<int>(dims[i].size());
      ins[i] = in.tensor_data().data();
      outs[i] = out->NumElements() ? const_cast<char*>(out->tensor_data().data()) : nullptr;
      ToKolo(in.dtype(), &dts[i]);
      names[i] = grouped_ ? Member(i) : name_;
      cnames[i] = names[i].c_str();
    }
    std::vector<kolo_handle_t> hs(n, 0);
    kolo_status_t st =
        grouped_ ? kolo_ps_grouped_reducescatter_async(ps_, n, cnames.data(), ins.data(),
                                                       outs.data(), ndims.data(), shapes.data(),
                                                       dts.data(), op_, hs.data())
                 : kolo_ps_reducescatter_async(ps_, cnames[0], ins[0], outs[0], ndims[0], shapes[0],
                                               dts[0], op_, hs.data());
    OP_REQUIRES_OK_ASYNC(ctx, Submitted(st), done);
    Finish(ctx, std::move(done), std::move(hs));
  }

 private:
  kolo_op_t op_ = KOLO_SUM;
  bool grouped_ = false;
};

class BarrierOp : public AsyncOpKernel {
 public:
  explicit BarrierOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &ps_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int ps = ps_;
    RunDetached([ctx, done, ps] {
      kolo_status_t st = kolo_ps_barrier(ps, -1);
      if (st != KOLO_OK) ctx->SetStatus(Failure("barrier", "(barrier)", st, LastError(st)));
      done();
    });
  }

 private:
  int ps_ = 0;
};

class JoinOp : public AsyncOpKernel {
 public:
  explicit JoinOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    RunDetached([ctx, done, out] {
      int last = -1;
      kolo_status_t st = kolo_join(-1, &last);
      if (st != KOLO_OK) ctx->SetStatus(Failure("join", "(join)", st, LastError(st)));
      out->scalar<int32_t>()() = last;
      done();
    });
  }
};

}  // namespace

#define KOLO_CPU_KERNEL(op, cls) \
  REGISTER_KERNEL_BUILDER(Name(op).Device(::tensorflow::DEVICE_CPU), cls)
KOLO_CPU_KERNEL("KoloAllreduce", AllreduceOp);
KOLO_CPU_KERNEL("KoloGroupedAllreduce", AllreduceOp);
KOLO_CPU_KERNEL("KoloBroadcast", BroadcastOp);
KOLO_CPU_KERNEL("KoloAllgather", AllgatherOp);
KOLO_CPU_KERNEL("KoloGroupedAllgather", AllgatherOp);
KOLO_CPU_KERNEL("KoloAlltoall", AlltoallOp);
KOLO_CPU_KERNEL("KoloReducescatter", ReducescatterOp);
KOLO_CPU_KERNEL("KoloGroupedReducescatter", ReducescatterOp);
KOLO_CPU_KERNEL("KoloBarrier", BarrierOp);
KOLO_CPU_KERNEL("KoloJoin", JoinOp);

}  // namespace kolo::tf
