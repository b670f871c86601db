/* mpi-allreduce-bench: Open MPI's collectives (float32; sum for the reducing
 * ones) measured exactly like kolo-bench measures kolo, so the tables line up:
 *
 *   mpirun --oversubscribe -np 2 --mca btl self,vader mpi-allreduce-bench -b 4 -e 256M
 *   mpirun ... mpi-allreduce-bench --op allgather
 *
 * --op: allreduce (MPI_Allreduce, the default), allgather (MPI_Allgather),
 * broadcast (MPI_Bcast, --root), alltoall (MPI_Alltoall), reducescatter
 * (MPI_Reduce_scatter_block), barrier (MPI_Barrier). The name stays from
 * when it only did allreduce.
 *
 * Same sizes per op (-b/-e/-f, nccl-tests' definition per op as
 * kolo::bench::opMessageSizes), same warm-up and iteration plan (the first
 * warm-up op, max-reduced across ranks, decides how many iterations fit -T
 * seconds), same statistic (median over iterations of the slowest rank's
 * time, the per-iteration times max-reduced outside the timed region), same
 * columns, busbw factors and the same check data as kolo-bench
 * (bench/bench_check.h): (r+1) * ((i % m) + 1) for the sums, exact in
 * float32, and ((i + 3 src + 5 dst) % 251) + 1 for the data the other ops move.
 *
 * --model-step FILE: Open MPI's blocking per-tensor loop
 * over a model's gradients instead of the size sweep: FILE is kolo-bench
 * --model-step's format ("name count" per line, '#' comments;
 * bench/models/NAME.txt), laid out in one buffer as kolo-bench does (each
 * tensor at a multiple of 64 B); one step is MPI_Allreduce(MPI_IN_PLACE,
 * float32, sum) of every tensor in REVERSE order, one after the other. Same
 * plan and statistic as the sweep; timed on zeros, checked once with -c 1.
 */
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#define HEADER                                                                                    \
  "#       size         count      type   redop    time(us)   algbw(GB/s)   busbw(GB/s)  #wrong" \
  "    cpu-s/GB"
#define CPU_DEFINITION                                                                    \
  "cpu-s/GB = CPU seconds (user + system) of every rank over the timed iterations / (size " \
  "x iterations / 1e9)"

/* CPU seconds (user + system, every thread) of this process so far. */
static double self_cpu_seconds(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

enum {
  OP_ALLREDUCE,
  OP_ALLGATHER,
  OP_BROADCAST,
  OP_ALLTOALL,
  OP_REDUCESCATTER,
  OP_BARRIER,
  NUM_OPS
};
static const char* const kOpNames[NUM_OPS] = {"allreduce", "allgather",     "broadcast",
                                              "alltoall",  "reducescatter", "barrier"};
static const char* const kMpiCalls[NUM_OPS] = {
    "MPI_Allreduce(MPI_FLOAT, MPI_SUM), out of place",
    "MPI_Allgather(MPI_FLOAT); size = the gathered output (n x each rank's count)",
    "MPI_Bcast(MPI_FLOAT), in place",
    "MPI_Alltoall(MPI_FLOAT); size = each rank's input (n blocks of count)",
    "MPI_Reduce_scatter_block(MPI_FLOAT, MPI_SUM); size = the input (n x each rank's count)",
    "MPI_Barrier; no data (one row, size 0); check: the last rank enters late"};

/* How late the last rank enters the barrier of a barrier check (as kolo-bench). */
#define BARRIER_LATE_ENTRY_NS 5000000L
/* movedValue's period for float32 (bench_check.h). */
#define MOVED_PERIOD 251

typedef struct {
  uint64_t min_bytes, max_bytes;
  double step_factor;
  int warmup_iters, iters, check;
  double max_time_s;
  const char* json_path;
  int op;
  int root;
  int in_place; /* allreduce with MPI_IN_PLACE */
  const char* model_path; /* --model-step FILE */
} Options;

typedef struct {
  uint64_t bytes, count; /* nccl-tests' size and count columns */
  double time_us, algbw, busbw;
  long long wrong; /* -1: not checked */
  int warmup, iters;
  double cpu_per_gb; /* every rank's CPU seconds over the timed loop per GB */
} Row;

static int parse_size(const char* s, uint64_t* out) {
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return -1;
  int shift = 0;
  if (*end == 'k' || *end == 'K')
    shift = 10;
  else if (*end == 'm' || *end == 'M')
    shift = 20;
  else if (*end == 'g' || *end == 'G')
    shift = 30;
  if (shift != 0) ++end;
  if (strcasecmp(end, "") != 0 && strcasecmp(end, "b") != 0 && strcasecmp(end, "ib") != 0)
    return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  if (n <= 0) return 0.0;
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/* Same rule as kolo::bench::planIterations. */
static void plan_iterations(const Options* o, double first_op_s, int* warmup, int* iters) {
  *warmup = o->warmup_iters < 1 ? 1 : o->warmup_iters;
  *iters = o->iters < 1 ? 1 : o->iters;
  if (!(o->max_time_s > 0) || !(first_op_s > 0)) return;
  double w = floor(o->max_time_s / 2 / first_op_s), n = floor(o->max_time_s / first_op_s);
  int min_iters = *iters < 3 ? *iters : 3;
  if (w < *warmup) *warmup = w < 1 ? 1 : (int)w;
  if (n < *iters) *iters = n < min_iters ? min_iters : (int)n;
}

static void usage(void) {
  printf(
      "mpi-allreduce-bench: Open MPI collectives (float32, sum), nccl-tests style table\n"
      "Usage: mpirun -np N mpi-allreduce-bench [options]\n"
      "  --op NAME              allreduce (default) allgather broadcast alltoall reducescatter "
      "barrier\n"
      "  --root R               broadcast's root rank (default 0)\n"
      "  -b,--minbytes SIZE     smallest size (default 4; K/M/G suffixes)\n"
      "  -e,--maxbytes SIZE     largest size (default 256M)\n"
      "  -f,--stepfactor F      size multiplier between rows (default 2)\n"
      "  -w,--warmup-iters N    warm-up iterations (default 5)\n"
      "  -n,--iters N           timed iterations (default 20)\n"
      "  -T,--max-time S        cut the timed loop to ~S seconds per size (default 0.5; 0: never)\n"
      "  -c,--check 0|1         verify every element (default 1)\n"
      "  --inplace              allreduce in place (MPI_IN_PLACE)\n"
      "  --model-step FILE      a model's gradients (kolo-bench --model-step's file format): time\n"
      "                         the blocking per-tensor loop (MPI_Allreduce in place, reverse order)\n"
      "  --json FILE            also write rank 0's rows as JSON\n");
}

/* 0: ok, 1: --help printed, -1: error printed. */
static int parse_args(int argc, char** argv, Options* o) {
  static const struct option longopts[] = {{"minbytes", required_argument, 0, 'b'},
                                           {"maxbytes", required_argument, 0, 'e'},
                                           {"stepfactor", required_argument, 0, 'f'},
                                           {"warmup-iters", required_argument, 0, 'w'},
                                           {"iters", required_argument, 0, 'n'},
                                           {"max-time", required_argument, 0, 'T'},
                                           {"check", required_argument, 0, 'c'},
                                           {"json", required_argument, 0, 'J'},
                                           {"op", required_argument, 0, 'O'},
                                           {"op-kind", required_argument, 0, 'O'},
                                           {"root", required_argument, 0, 'R'},
                                           {"inplace", no_argument, 0, 'I'},
                                           {"model-step", required_argument, 0, 'M'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  int c, bad = 0;
  while (!bad && (c = getopt_long(argc, argv, "b:e:f:w:n:T:c:h", longopts, NULL)) != -1) {
    switch (c) {
      case 'b':
        bad = parse_size(optarg, &o->min_bytes) != 0;
        break;
      case 'e':
        bad = parse_size(optarg, &o->max_bytes) != 0;
        break;
      case 'f':
        o->step_factor = atof(optarg);
        break;
      case 'w':
        o->warmup_iters = atoi(optarg);
        break;
      case 'n':
        o->iters = atoi(optarg);
        break;
      case 'T':
        o->max_time_s = atof(optarg);
        break;
      case 'c':
        o->check = atoi(optarg);
        break;
      case 'J':
        o->json_path = optarg;
        break;
      case 'O':
        o->op = -1;
        for (int k = 0; k < NUM_OPS; ++k) {
          if (strcasecmp(optarg, kOpNames[k]) == 0) o->op = k;
        }
        if (o->op < 0) {
          fprintf(stderr,
                  "mpi-allreduce-bench: unknown --op '%s' (allreduce allgather broadcast alltoall "
                  "reducescatter barrier)\n",
                  optarg);
          return -1;
        }
        break;
      case 'R':
        o->root = atoi(optarg);
        break;
      case 'I':
        o->in_place = 1;
        break;
      case 'M':
        o->model_path = optarg;
        break;
      case 'h':
        usage();
        return 1;
      default:
        bad = 1;
        break;
    }
  }
  if (bad || optind < argc) {
    fprintf(stderr, "mpi-allreduce-bench: bad option or argument (see --help)\n");
    return -1;
  }
  if (o->min_bytes < 1 || o->max_bytes < o->min_bytes || !(o->step_factor > 1.0) || o->iters < 1 ||
      o->warmup_iters < 0 || o->max_time_s < 0 || (o->check != 0 && o->check != 1) ||
      o->max_bytes / 4 > (uint64_t)INT_MAX || o->root < 0) {
    fprintf(stderr, "mpi-allreduce-bench: invalid options (see --help)\n");
    return -1;
  }
  if (o->model_path != NULL && o->op != OP_ALLREDUCE) {
    fprintf(stderr, "mpi-allreduce-bench: --model-step replays allreduces only\n");
    return -1;
  }
  if (o->in_place && o->op != OP_ALLREDUCE) {
    fprintf(stderr, "mpi-allreduce-bench: --inplace is for --op allreduce\n");
    return -1;
  }
  return 0;
}

static int check_modulus(int nranks) {
  double weighted = (double)nranks * (nranks + 1) / 2.0;
  double m = floor(16777216.0 / weighted);
  return m < 1 ? 1 : (m > 7 ? 7 : (int)m);
}

/* Rank `rank`'s sum input for elements first .. first+count-1. */
static void fill_input(float* buf, uint64_t count, int rank, int m) {
  int k = 0;
  for (uint64_t i = 0; i < count; ++i) {
    buf[i] = (float)((rank + 1) * (k + 1));
    if (++k == m) k = 0;
  }
}

/* Wrong elements of a sum result whose buf[0] is element `first`. */
static long long count_wrong(const float* buf, uint64_t count, uint64_t first, int nranks, int m) {
  double scale = (double)nranks * (nranks + 1) / 2.0;
  long long wrong = 0;
  int k = (int)(first % (uint64_t)m);
  for (uint64_t i = 0; i < count; ++i) {
    if (!((double)buf[i] == scale * (k + 1))) ++wrong;
    if (++k == m) k = 0;
  }
  return wrong;
}

/* kolo::bench::fillMoved / countWrongMoved for float32. */
static int moved_offset(int src, int dst) {
  return (int)((3 * (uint64_t)src + 5 * (uint64_t)dst) % MOVED_PERIOD);
}

static void fill_moved(float* buf, uint64_t count, int src, int dst) {
  int k = moved_offset(src, dst);
  for (uint64_t i = 0; i < count; ++i) {
    buf[i] = (float)(k + 1);
    if (++k == MOVED_PERIOD) k = 0;
  }
}

static long long count_wrong_moved(const float* buf, uint64_t count, int src, int dst) {
  long long wrong = 0;
  int k = moved_offset(src, dst);
  for (uint64_t i = 0; i < count; ++i) {
    if (!((double)buf[i] == (double)(k + 1))) ++wrong;
    if (++k == MOVED_PERIOD) k = 0;
  }
  return wrong;
}

/* One operation; count is nccl-tests' per-op count (opMessageSizes). */
static void run_once(const Options* o, int nranks, float* send, float* recv, int count) {
  switch (o->op) {
    case OP_ALLREDUCE:
      if (o->in_place) {
        MPI_Allreduce(MPI_IN_PLACE, send, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else {
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
      break;
    case OP_ALLGATHER:
      MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case OP_BROADCAST:
      MPI_Bcast(send, count, MPI_FLOAT, o->root, MPI_COMM_WORLD);
      break;
    case OP_ALLTOALL:
      MPI_Alltoall(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case OP_REDUCESCATTER:
      MPI_Reduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case OP_BARRIER:
      MPI_Barrier(MPI_COMM_WORLD);
      break;
  }
  (void)nranks;
}

/* Checkable input and a poisoned output. */
static void fill_buffers(const Options* o, int rank, int nranks, int m, float* send, float* recv,
                         uint64_t count) {
  uint64_t n = (uint64_t)nranks;
  switch (o->op) {
    case OP_ALLREDUCE:
      fill_input(send, count, rank, m);
      memset(recv, 0, count * 4);
      break;
    case OP_REDUCESCATTER:
      fill_input(send, count * n, rank, m);
      memset(recv, 0, count * 4);
      break;
    case OP_ALLGATHER:
      fill_moved(send, count, rank, 0);
      memset(recv, 0, count * n * 4);
      break;
    case OP_BROADCAST:
      fill_moved(send, count, rank, 0);
      break;
    case OP_ALLTOALL:
      for (uint64_t d = 0; d < n; ++d) fill_moved(send + d * count, count, rank, (int)d);
      memset(recv, 0, count * n * 4);
      break;
    default:
      break;
  }
}

static long long count_wrong_output(const Options* o, int rank, int nranks, int m,
                                    const float* send, const float* recv, uint64_t count) {
  long long wrong = 0;
  switch (o->op) {
    case OP_ALLREDUCE:
      return count_wrong(o->in_place ? send : recv, count, 0, nranks, m);
    case OP_REDUCESCATTER:
      return count_wrong(recv, count, (uint64_t)rank * count, nranks, m);
    case OP_BROADCAST:
      return count_wrong_moved(send, count, o->root, 0);
    case OP_ALLGATHER:
    case OP_ALLTOALL:
      for (int s = 0; s < nranks; ++s) {
        wrong += count_wrong_moved(recv + (uint64_t)s * count, count, s,
                                   o->op == OP_ALLTOALL ? rank : 0);
      }
      return wrong;
    default:
      return 0;
  }
}

static double monotonic_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* As kolo-bench's checkBarrier: 1 if this rank left the barrier before the
 * last rank (entering late) had entered it. */
static long long check_barrier(int rank, int nranks) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == nranks - 1) {
    struct timespec late = {0, BARRIER_LATE_ENTRY_NS};
    nanosleep(&late, NULL);
  }
  double entered = monotonic_s();
  MPI_Barrier(MPI_COMM_WORLD);
  double left = monotonic_s();
  MPI_Allreduce(MPI_IN_PLACE, &entered, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (left < entered) {
    fprintf(
        stderr,
        "mpi-allreduce-bench: rank %d left the barrier %.1f us before the last rank entered it\n",
        rank, (entered - left) * 1e6);
    return 1;
  }
  return 0;
}

static double bus_factor(int op, int nranks) {
  double n = nranks;
  switch (op) {
    case OP_ALLREDUCE:
      return 2.0 * (n - 1) / n;
    case OP_ALLGATHER:
    case OP_ALLTOALL:
    case OP_REDUCESCATTER:
      return (n - 1) / n;
    case OP_BROADCAST:
      return 1.0;
    default:
      return 0.0;
  }
}

static int op_reduces(int op) { return op == OP_ALLREDUCE || op == OP_REDUCESCATTER; }

static void print_row(const Options* o, const Row* r) {
  char wrong[32];
  if (r->wrong >= 0)
    snprintf(wrong, sizeof(wrong), "%8lld", r->wrong);
  else
    snprintf(wrong, sizeof(wrong), "%8s", "N/A");
  printf("%12" PRIu64 "%14" PRIu64 "%10s%8s%12.2f%14.2f%14.2f%s%12.4g\n", r->bytes, r->count,
         o->op == OP_BARRIER ? "none" : "float32", op_reduces(o->op) ? "sum" : "none", r->time_us,
         r->algbw, r->busbw, wrong, r->cpu_per_gb);
  fflush(stdout);
}

static void write_json(const Options* o, int nranks, const Row* rows, int nrows, double avg) {
  FILE* f = fopen(o->json_path, "w");
  if (f == NULL) {
    fprintf(stderr, "mpi-allreduce-bench: cannot write %s\n", o->json_path);
    return;
  }
  const char* type = o->op == OP_BARRIER ? "none" : "float32";
  const char* redop = op_reduces(o->op) ? "sum" : "none";
  fprintf(f, "{\n  \"benchmark\": \"mpi-allreduce-bench\",\n  \"op_kind\": \"%s\",\n",
          kOpNames[o->op]);
  fprintf(f, "  \"nranks\": %d,\n  \"dtype\": \"float32\",\n  \"op\": \"%s\",\n", nranks, redop);
  if (o->op == OP_BROADCAST) fprintf(f, "  \"root\": %d,\n", o->root);
  fprintf(f, "  \"avg_busbw_gbps\": %.6g,\n  \"rows\": [\n", avg);
  for (int i = 0; i < nrows; ++i) {
    const Row* r = &rows[i];
    fprintf(f,
            "    {\"size\": %" PRIu64 ", \"count\": %" PRIu64
            ", \"type\": \"%s\", \"redop\": \"%s\", "
            "\"time_us\": %.6g, \"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g, \"warmup\": %d, "
            "\"iters\": %d, \"cpu_s_per_gb\": %.6g, ",
            r->bytes, r->count, type, redop, r->time_us, r->algbw, r->busbw, r->warmup, r->iters,
            r->cpu_per_gb);
    if (r->wrong >= 0)
      fprintf(f, "\"wrong\": %lld}%s\n", r->wrong, i + 1 < nrows ? "," : "");
    else
      fprintf(f, "\"wrong\": null}%s\n", i + 1 < nrows ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
}


/* ---- --model-step FILE ------------------------------------------------- */

#define MODEL_ALIGN 64 /* kolo::bench::kModelTensorAlign */

typedef struct {
  char name[256];
  uint64_t count, offset; /* elements; byte offset in the buffer */
} ModelTensor;

/* Parses FILE (kolo::bench::parseModel's format); prints the error and
 * returns -1 on bad input. *out is malloc'd. */
static int load_model(const char* path, ModelTensor** out, int* n_out, uint64_t* bytes_out) {
  FILE* f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "mpi-allreduce-bench: cannot read %s\n", path);
    return -1;
  }
  ModelTensor* t = NULL;
  int n = 0, cap = 0, lineno = 0;
  uint64_t off = 0;
  char line[4096];
  while (fgets(line, sizeof(line), f) != NULL) {
    ++lineno;
    char* hash = strchr(line, '#');
    if (hash != NULL) *hash = '\0';
    char name[256], extra[8];
    unsigned long long count = 0;
    int k = sscanf(line, "%255s %llu %7s", name, &count, extra);
    if (k <= 0) continue; /* blank */
    if (k != 2 || count == 0 || count > (unsigned long long)INT_MAX) {
      fprintf(stderr, "mpi-allreduce-bench: %s: line %d: expected 'name count' (count 1..%d)\n", path,
              lineno, INT_MAX);
      fclose(f);
      free(t);
      return -1;
    }
    if (n == cap) {
      cap = cap ? 2 * cap : 256;
      ModelTensor* nt = realloc(t, sizeof(ModelTensor) * (size_t)cap);
      if (nt == NULL) {
        fclose(f);
        free(t);
        return -1;
      }
      t = nt;
    }
    snprintf(t[n].name, sizeof(t[n].name), "%s", name);
    t[n].count = count;
    t[n].offset = off;
    off = (off + count * 4 + MODEL_ALIGN - 1) / MODEL_ALIGN * MODEL_ALIGN;
    ++n;
  }
  fclose(f);
  if (n == 0) {
    fprintf(stderr, "mpi-allreduce-bench: %s lists no tensors\n", path);
    free(t);
    return -1;
  }
  *out = t;
  *n_out = n;
  *bytes_out = off;
  return 0;
}

/* One step: every tensor, reverse order, blocking, in place. */
static void model_step_once(const ModelTensor* t, int n, char* base) {
  for (int i = n - 1; i >= 0; --i) {
    MPI_Allreduce(MPI_IN_PLACE, base + t[i].offset, (int)t[i].count, MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  }
}

static int model_step_main(const Options* o, int rank, int nranks) {
  ModelTensor* t = NULL;
  int n = 0;
  uint64_t layout_bytes = 0;
  int bad = rank == 0 ? load_model(o->model_path, &t, &n, &layout_bytes) : 0;
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (bad) return 2;
  if (rank != 0 && load_model(o->model_path, &t, &n, &layout_bytes) != 0) MPI_Abort(MPI_COMM_WORLD, 2);
  uint64_t params = 0;
  for (int i = 0; i < n; ++i) params += t[i].count;
  const uint64_t bytes = params * 4;
  /* The model's name: the file name without directory and extension. */
  char model[256];
  const char* slash = strrchr(o->model_path, '/');
  snprintf(model, sizeof(model), "%s", slash ? slash + 1 : o->model_path);
  char* dot = strrchr(model, '.');
  if (dot != NULL && dot != model) *dot = '\0';

  size_t alloc = (size_t)((layout_bytes + 4095) / 4096 * 4096);
  char* base = aligned_alloc(4096, alloc);
  double* times = malloc(sizeof(double) * (size_t)(o->iters > 0 ? o->iters : 1));
  if (base == NULL || times == NULL) {
    fprintf(stderr, "mpi-allreduce-bench: rank %d: out of memory\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    char* nl = strchr(version, '\n');
    if (nl != NULL) *nl = '\0';
    char* comma = strchr(version, ',');
    if (comma != NULL) *comma = '\0';
    printf("# mpi-allreduce-bench model step: %s (%s): %d tensors, %" PRIu64 " parameters, %" PRIu64
           " B of float32 gradients; nranks %d, %s\n",
           model, o->model_path, n, params, bytes, nranks, version);
    printf("# step: MPI_Allreduce(MPI_IN_PLACE, MPI_FLOAT, MPI_SUM) of every tensor in reverse order, "
           "one after the other (blocking per-tensor loop)\n");
    printf("# time = median over steps of the slowest rank's step time; warmup iters: %d iters: %d "
           "(cut to ~%g s) validation: %d\n",
           o->warmup_iters, o->iters, o->max_time_s, o->check);
    printf("# %s\n#\n", CPU_DEFINITION);
    printf("#%11s %7s %10s %12s %12s %11s %11s %7s %11s\n", "model", "tensors", "params", "size(B)",
           "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "cpu-s/GB");
    fflush(stdout);
  }

  memset(base, 0, alloc); /* zeros while timed: in-place sums stay finite */
  double t0 = MPI_Wtime();
  model_step_once(t, n, base);
  double first = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int warmup, iters;
  plan_iterations(o, first, &warmup, &iters);
  for (int i = 1; i < warmup; ++i) model_step_once(t, n, base);
  double cpu = self_cpu_seconds();
  for (int i = 0; i < iters; ++i) {
    t0 = MPI_Wtime();
    model_step_once(t, n, base);
    times[i] = MPI_Wtime() - t0;
  }
  cpu = self_cpu_seconds() - cpu;
  MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &cpu, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  double sec = median(times, iters);

  long long wrong = -1;
  if (o->check) {
    int m = check_modulus(nranks);
    /* As kolo-bench: each tensor's check data starts at its element 0. */
    for (int i = 0; i < n; ++i) fill_input((float*)(base + t[i].offset), t[i].count, rank, m);
    model_step_once(t, n, base);
    wrong = 0;
    for (int i = 0; i < n; ++i) wrong += count_wrong((const float*)(base + t[i].offset), t[i].count, 0, nranks, m);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  }
  if (rank == 0) {
    double algbw = sec > 0 ? (double)bytes / 1e9 / sec : 0.0;
    double busbw = algbw * bus_factor(OP_ALLREDUCE, nranks);
    char wrong_s[32];
    if (wrong >= 0)
      snprintf(wrong_s, sizeof(wrong_s), "%lld", wrong);
    else
      snprintf(wrong_s, sizeof(wrong_s), "N/A");
    printf("%12s %7d %10" PRIu64 " %12" PRIu64 " %12.1f %11.2f %11.2f %7s %11.4g\n", model, n, params,
           bytes, sec * 1e6, algbw, busbw, wrong_s, cpu / ((double)bytes * iters / 1e9));
    printf("# steps timed: %d (warm-up %d)\n", iters, warmup);
    printf("# Out of bounds values : %lld %s\n", wrong > 0 ? wrong : 0, wrong > 0 ? "FAILED" : "OK");
    /* Parsed by bench/model_compare.sh. */
    printf("# Model step (MPI blocking per-tensor loop) : %.1f us\n#\n", sec * 1e6);
    fflush(stdout);
    if (o->json_path != NULL) {
      FILE* f = fopen(o->json_path, "w");
      if (f != NULL) {
        fprintf(f,
                "{\n  \"benchmark\": \"mpi-allreduce-bench --model-step\",\n  \"model_file\": \"%s\",\n"
                "  \"model\": \"%s\",\n  \"nranks\": %d,\n  \"dtype\": \"float32\",\n  \"op\": \"sum\",\n"
                "  \"tensors\": %d,\n  \"params\": %" PRIu64 ",\n  \"bytes\": %" PRIu64
                ",\n  \"blocking_us\": %.6g,\n  \"steps\": %d,\n  \"cpu_s_per_gb\": %.6g,\n",
                o->model_path, model, nranks, n, params, bytes, sec * 1e6, iters,
                cpu / ((double)bytes * iters / 1e9));
        if (wrong >= 0)
          fprintf(f, "  \"wrong\": %lld\n}\n", wrong);
        else
          fprintf(f, "  \"wrong\": null\n}\n");
        fclose(f);
      } else {
        fprintf(stderr, "mpi-allreduce-bench: cannot write %s\n", o->json_path);
      }
    }
  }
  free(times);
  free(base);
  free(t);
  return wrong > 0 ? 1 : 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  Options o = {4, (uint64_t)256 << 20, 2.0, 5, 20, 1, 0.5, NULL, OP_ALLREDUCE, 0, 0, NULL};
  int pr = parse_args(argc, argv, &o);
  if (pr == 0 && o.op == OP_BROADCAST && o.root >= nranks) {
    if (rank == 0)
      fprintf(stderr, "mpi-allreduce-bench: --root %d is not a rank of this job (size %d)\n",
              o.root, nranks);
    pr = -1;
  }
  if (pr != 0) {
    MPI_Finalize();
    return pr > 0 ? 0 : 2;
  }
  if (o.model_path != NULL) {
    int rc = model_step_main(&o, rank, nranks);
    MPI_Finalize();
    return rc;
  }

  /* Sizes and counts: as kolo::bench::opMessageSizes for 4-byte elements. */
  const int parts = o.op == OP_ALLGATHER || o.op == OP_ALLTOALL || o.op == OP_REDUCESCATTER;
  const uint64_t n = (uint64_t)nranks;
  uint64_t* sizes = NULL;
  uint64_t* counts = NULL;
  int nsizes = 0, cap = 0;
  for (uint64_t s = o.min_bytes; s <= o.max_bytes;) {
    uint64_t b = s / 4 * 4, c;
    if (b < 4) b = 4;
    if (parts) {
      c = b / 4 / n;
      if (c < 1) c = 1;
      b = c * n * 4;
    } else {
      c = b / 4;
    }
    if (o.op == OP_BARRIER) b = c = 0;
    if (nsizes == cap) {
      cap = cap ? 2 * cap : 64;
      sizes = realloc(sizes, sizeof(uint64_t) * (size_t)cap);
      counts = realloc(counts, sizeof(uint64_t) * (size_t)cap);
      if (sizes == NULL || counts == NULL) MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (nsizes == 0 || sizes[nsizes - 1] != b) {
      sizes[nsizes] = b;
      counts[nsizes++] = c;
    }
    if (o.op == OP_BARRIER) break;
    double next = floor((double)s * o.step_factor);
    s = next > (double)(s + 1) ? (uint64_t)next : s + 1;
  }
  uint64_t max_bytes = 0;
  for (int i = 0; i < nsizes; ++i) max_bytes = sizes[i] > max_bytes ? sizes[i] : max_bytes;
  size_t alloc = (size_t)((max_bytes + 4095) / 4096 * 4096);
  if (alloc == 0) alloc = 4096;
  float* send = aligned_alloc(4096, alloc);
  float* recv = aligned_alloc(4096, alloc);
  Row* rows = calloc((size_t)nsizes, sizeof(Row));
  double* times = malloc(sizeof(double) * (size_t)(o.iters > 0 ? o.iters : 1));
  if (send == NULL || recv == NULL || rows == NULL || times == NULL) {
    fprintf(stderr, "mpi-allreduce-bench: rank %d: out of memory\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int m = check_modulus(nranks);

  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    char* nl = strchr(version, '\n');
    if (nl != NULL) *nl = '\0';
    char* comma = strchr(version, ',');
    if (comma != NULL) *comma = '\0';
    printf("# mpi-allreduce-bench %s: nranks %d, %s\n", kOpNames[o.op], nranks, version);
    printf("# dtype float32, op %s, %s", op_reduces(o.op) ? "sum" : "none",
           o.op == OP_ALLREDUCE && o.in_place ? "MPI_Allreduce(MPI_FLOAT, MPI_SUM), in place (MPI_IN_PLACE)"
                                               : kMpiCalls[o.op]);
    if (o.op == OP_BROADCAST) printf(", root %d", o.root);
    printf("\n");
    printf("# minBytes %" PRIu64 " maxBytes %" PRIu64
           " step: %g(factor) warmup iters: %d iters: %d "
           "(cut to ~%g s per size) validation: %d\n",
           sizes[0], max_bytes, o.step_factor, o.warmup_iters, o.iters, o.max_time_s, o.check);
    printf("# time = median over iterations of the slowest rank's time per operation\n");
    printf("# %s\n#\n%s\n", CPU_DEFINITION, HEADER);
    fflush(stdout);
  }

  long long total_wrong = 0;
  for (int si = 0; si < nsizes; ++si) {
    uint64_t bytes = sizes[si];
    int count = (int)counts[si];
    fill_buffers(&o, rank, nranks, m, send, recv, (uint64_t)count);

    double t0 = MPI_Wtime();
    run_once(&o, nranks, send, recv, count);
    double first = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int warmup, iters;
    plan_iterations(&o, first, &warmup, &iters);
    for (int i = 1; i < warmup; ++i) run_once(&o, nranks, send, recv, count);
    double cpu = self_cpu_seconds();
    for (int i = 0; i < iters; ++i) {
      t0 = MPI_Wtime();
      run_once(&o, nranks, send, recv, count);
      times[i] = MPI_Wtime() - t0;
    }
    cpu = self_cpu_seconds() - cpu;
    MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &cpu, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

    Row* r = &rows[si];
    double sec = median(times, iters);
    r->bytes = bytes;
    r->count = (uint64_t)count;
    r->time_us = sec * 1e6;
    r->algbw = sec > 0 ? (double)bytes / 1e9 / sec : 0.0;
    r->busbw = r->algbw * bus_factor(o.op, nranks);
    r->warmup = warmup;
    r->iters = iters;
    r->cpu_per_gb = bytes > 0 ? cpu / ((double)bytes * iters / 1e9) : 0.0;
    r->wrong = -1;
    if (o.check) {
      long long wrong;
      if (o.op == OP_BARRIER) {
        wrong = check_barrier(rank, nranks);
      } else {
        fill_buffers(&o, rank, nranks, m, send, recv, (uint64_t)count);
        run_once(&o, nranks, send, recv, count);
        wrong = count_wrong_output(&o, rank, nranks, m, send, recv, (uint64_t)count);
      }
      MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      r->wrong = wrong;
      total_wrong += wrong;
    }
    if (rank == 0) print_row(&o, r);
  }

  if (rank == 0) {
    double avg = 0;
    for (int i = 0; i < nsizes; ++i) avg += rows[i].busbw;
    avg /= nsizes;
    printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong == 0 ? "OK" : "FAILED");
    printf("# Avg bus bandwidth : %g\n", avg);
    printf("# Latency (%" PRIu64 " B %s, median of the slowest rank) : %.2f us\n#\n", rows[0].bytes,
           kOpNames[o.op], rows[0].time_us);
    fflush(stdout);
    if (o.json_path != NULL) write_json(&o, nranks, rows, nsizes, avg);
  }
  free(times);
  free(rows);
  free(sizes);
  free(counts);
  free(send);
  free(recv);
  MPI_Finalize();
  return total_wrong == 0 ? 0 : 1;
}
