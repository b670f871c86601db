/* A complete libkolo program in C (docs/user-guide-cpp.md walks through it).
 * Run it under kolorun:   kolorun -np 2 ./kolo_client_example_c */
#include <kolo/kolo_c.h>
#include <stdio.h>

static int fail(const char* what, kolo_status_t s) {
  fprintf(stderr, "rank %d: %s: %s: %s\n", kolo_rank(), what, kolo_status_string(s),
          kolo_last_error());
  kolo_shutdown();
  return 1;
}

int main(void) {
  kolo_status_t s = kolo_init();
  if (s != KOLO_OK) return fail("kolo_init", s);
  int rank = kolo_rank(), size = kolo_size();

  /* Sum 1000 doubles across ranks, asynchronously. */
  double x[1000];
  for (int i = 0; i < 1000; ++i) x[i] = rank + 1;
  int64_t shape[1] = {1000};
  kolo_handle_t h;
  s = kolo_allreduce_async("x", x, x, 1, shape, KOLO_FLOAT64, KOLO_SUM, 1.0, 1.0, &h);
  if (s != KOLO_OK) return fail("kolo_allreduce_async", s);
  /* ... other work here ... */
  s = kolo_synchronize(h, -1); /* -1: up to KOLO_OP_TIMEOUT */
  if (s != KOLO_OK) return fail("kolo_synchronize", s);
  int ok = x[999] == size * (size + 1) / 2.0;

  /* Zero copy: allocate the tensor in the shared arena. */
  float* g = (float*)kolo_alloc_shared(4096 * sizeof(float));
  if (g == NULL) return fail("kolo_alloc_shared", kolo_last_status());
  for (int i = 0; i < 4096; ++i) g[i] = 1.0f;
  int64_t gshape[1] = {4096};
  s = kolo_allreduce("g", g, g, 1, gshape, KOLO_FLOAT32, KOLO_AVERAGE, 1.0, 1.0);
  if (s != KOLO_OK) return fail("kolo_allreduce", s);
  ok = ok && g[4095] == 1.0f;
  kolo_free_shared(g);

  printf("rank %d of %d: %s\n", rank, size, ok ? "ok" : "WRONG RESULT");
  kolo_shutdown();
  return ok ? 0 : 1;
}
