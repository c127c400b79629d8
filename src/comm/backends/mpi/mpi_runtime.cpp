#include "comm/backends/mpi/mpi_runtime.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdio>

#include "core/errors.h"

namespace krab::comm::mpi_detail {
namespace {

using namespace std::chrono_literals;

// ---- 16-bit float reductions: MPI has no bfloat16 or float16, so krab brings its own ops. ----
// Both types are opaque 2-byte elements to MPI; the op tells them apart by the datatype handle.

MPI_Datatype g_bf16 = MPI_DATATYPE_NULL;
MPI_Datatype g_half = MPI_DATATYPE_NULL;

template <typename T, typename F>
void combine(void* in, void* inout, int n, F f) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < n; ++i) b[i] = T(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

template <typename F>
void combine16(void* in, void* inout, const int* len, const MPI_Datatype* type, F f) {
  if (*type == g_bf16)
    combine<c10::BFloat16>(in, inout, *len, f);
  else
    combine<c10::Half>(in, inout, *len, f);
}

void sum16(void* in, void* inout, int* len, MPI_Datatype* type) {
  combine16(in, inout, len, type, [](float a, float b) { return a + b; });
}
void max16(void* in, void* inout, int* len, MPI_Datatype* type) {
  combine16(in, inout, len, type, [](float a, float b) { return std::max(a, b); });
}
void min16(void* in, void* inout, int* len, MPI_Datatype* type) {
  combine16(in, inout, len, type, [](float a, float b) { return std::min(a, b); });
}

bool is_16bit_float(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

Runtime* g_runtime = nullptr;  // written once, under mpi_mutex(), when MPI is up

struct FinalizeGuard {
  ~FinalizeGuard() {
    if (g_runtime) g_runtime->finalize();
  }
};

}  // namespace

std::mutex& mpi_mutex() {
  static std::mutex m;
  return m;
}

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return str_cat("MPI error ", code);
  return std::string(buf, len);
}

Runtime& Runtime::get() {
  static Runtime* rt = [] {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    g_runtime = new Runtime();  // never deleted: see the header
    return g_runtime;
  }();
  // Constructed only once MPI is up, so destroyed (finalising MPI) at exit.
  static FinalizeGuard guard;
  return *rt;
}

Runtime* Runtime::if_started() { return g_runtime; }

Runtime::Runtime() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    throw Error("MPI was already finalised in this process; the mpi backend cannot restart it");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) throw Error(str_cat("MPI_Init_thread failed: ", mpi_error_string(rc)));
    owns_init_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    throw NotSupported(str_cat("the mpi backend needs MPI_THREAD_SERIALIZED or better, but MPI ",
                               "was initialised with thread level ", provided,
                               " (by the application?)"));
  MPI_Type_contiguous(2, MPI_BYTE, &g_bf16);
  MPI_Type_commit(&g_bf16);
  MPI_Type_contiguous(2, MPI_BYTE, &g_half);
  MPI_Type_commit(&g_half);
  MPI_Op_create(&sum16, /*commute=*/1, &sum16_);
  MPI_Op_create(&max16, 1, &max16_);
  MPI_Op_create(&min16, 1, &min16_);
  element_.fill(MPI_DATATYPE_NULL);
  element_[1] = MPI_BYTE;
  for (int size : {2, 4, 8, 16}) {
    MPI_Type_contiguous(size, MPI_BYTE, &element_[size]);
    MPI_Type_commit(&element_[size]);
  }
}

MPI_Datatype Runtime::element_type(size_t item_size) const {
  return item_size < element_.size() ? element_[item_size] : MPI_DATATYPE_NULL;
}

MPI_Datatype Runtime::reduce_type(at::ScalarType t, const char* what) const {
  switch (t) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kChar:
      return MPI_INT8_T;
    case at::kByte:
      return MPI_UINT8_T;
    case at::kShort:
      return MPI_INT16_T;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    case at::kBFloat16:
      return g_bf16;
    case at::kHalf:
      return g_half;
    default:
      throw NotSupported(str_cat(what, ": the mpi backend cannot reduce dtype ", t,
                                 " (supported: float32, float64, bfloat16, float16, int8, uint8,"
                                 " int16, int32, int64)"));
  }
}

MPI_Op Runtime::reduce_op(ReduceOp op, at::ScalarType t) const {
  const bool sixteen = is_16bit_float(t);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return sixteen ? sum16_ : MPI_SUM;
    case ReduceOp::kMax:
      return sixteen ? max16_ : MPI_MAX;
    case ReduceOp::kMin:
      return sixteen ? min16_ : MPI_MIN;
  }
  return MPI_SUM;
}

void Runtime::adopt(MPI_Request request, std::vector<at::Tensor> keep, bool timed_out) {
  if (finalized_ || request == MPI_REQUEST_NULL) return;
  orphans_.push_back({request, std::move(keep)});
  stuck_ = stuck_ || timed_out;
}

void Runtime::reap() {
  orphans_.erase(std::remove_if(orphans_.begin(), orphans_.end(),
                                [](Orphan& o) {
                                  int done = 0;
                                  MPI_Test(&o.request, &done, MPI_STATUS_IGNORE);
                                  return done != 0;
                                }),
                 orphans_.end());
}

void Runtime::finalize() {
  std::lock_guard<std::mutex> lock(mpi_mutex());
  if (!owns_init_ || finalized_) return;
  // Dropped-but-healthy ops finish if the peers are still exiting normally; give them a while.
  const auto deadline = Clock::now() + (stuck_ ? 0ms : 5000ms);
  Backoff backoff;
  for (reap(); !orphans_.empty() && Clock::now() < deadline; reap()) backoff.pause();
  if (!orphans_.empty()) {
    std::fprintf(stderr,
                 "krab: %zu MPI operation(s) still pending at exit (e.g. after a timeout); "
                 "aborting the MPI job so that no rank hangs in MPI_Finalize\n",
                 orphans_.size());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  finalized_ = true;
  MPI_Finalize();
}

}  // namespace krab::comm::mpi_detail
