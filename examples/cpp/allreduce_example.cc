// A complete libkolo program in C++ (docs/user-guide-cpp.md walks through it).
// Run it under kolorun:   kolorun -np 2 ./kolo_client_example
#include <cstdio>
#include <kolo/kolo.hpp>
#include <string>
#include <vector>

static int fail(const char* what, const kolo::Result& r) {
  std::fprintf(stderr, "rank %d: %s: %s\n", kolo::rank(), what, r.toString().c_str());
  kolo::shutdown();
  return 1;
}

int main() {
  // Connects to the node's kolo-agent; the settings come from the KOLO_*
  // environment that kolorun sets for each rank.
  kolo::Result r = kolo::init();
  if (!r) return fail("init", r);
  const int rank = kolo::rank();
  const int size = kolo::size();

  // 1. Blocking allreduce: every rank ends with the average of all ranks.
  std::vector<float> grad(1 << 20, static_cast<float>(rank + 1));
  r = kolo::allreduce("grad.0", grad.data(), grad.data(), {static_cast<int64_t>(grad.size())},
                      kolo::DataType::kFloat32, kolo::ReduceOp::kAverage);
  if (!r) return fail("allreduce grad.0", r);
  bool ok = grad[0] == (size + 1) / 2.0f;

  // 2. Asynchronous: start several (they overlap with whatever runs next),
  //    then wait for each handle.
  std::vector<std::vector<float>> layers(4, std::vector<float>(1000, 1.0f));
  std::vector<kolo::Handle> handles;
  for (size_t i = 0; i < layers.size(); ++i) {
    auto h = kolo::allreduceAsync("layer." + std::to_string(i), layers[i].data(), layers[i].data(),
                                  {1000}, kolo::DataType::kFloat32, kolo::ReduceOp::kSum);
    if (!h) return fail("allreduceAsync", h.result());
    handles.push_back(std::move(h).value());
  }
  for (kolo::Handle& h : handles) {
    r = h.wait();  // or kolo::synchronize(h, timeout_ms)
    if (!r) return fail("wait", r);
  }
  for (const auto& layer : layers) ok = ok && layer[999] == static_cast<float>(size);

  // 3. Zero copy: a tensor that lives in the shared arena is reduced in place.
  {
    auto buf = kolo::SharedBuffer::allocate(256 * sizeof(int64_t));
    if (!buf) return fail("SharedBuffer::allocate", buf.result());
    int64_t* v = buf->as<int64_t>();
    for (int i = 0; i < 256; ++i) v[i] = rank;
    r = kolo::allreduce("ranks.max", v, 256, kolo::ReduceOp::kMax);
    if (!r) return fail("allreduce ranks.max", r);
    ok = ok && v[255] == size - 1;
  }  // the buffer goes back to the arena here

  std::printf("rank %d of %d: %s\n", rank, size, ok ? "ok" : "WRONG RESULT");
  kolo::shutdown();
  return ok ? 0 : 1;
}
