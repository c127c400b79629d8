// Memory and traffic of ZeRO sharding, as numbers: what one rank holds and sends per step at
// stages 0-3, predicted from the parameter table alone (no model is built, nothing is
// allocated). The launcher checks a job against it before spawning, the report prints it beside
// what was measured, and the engine tests check their traffic meters against zero_traffic().
// The companion of comm/traffic.h, whose ring model it uses for every collective.
//
// Terms (docs/design/zero-sharding.md §1.2, §1.3, §5.1). The parameters are split into units;
// units[0] is the root unit (what no wrap glob took), the others follow in forward order. A
// unit of numel_u elements is laid out as one flat padded to padded_u = roundup(numel_u, N·A)
// (N = world size, A = alignment in elements), of which each rank owns a shard of S_u =
// padded_u / N. Write Ψ = Σ numel_u, Ψp = Σ padded_u, Ψmax = the largest padded non-root unit,
// k = optimizer fp32 values per parameter (SGD 0, SGD with momentum 1, Adam / AdamW 2, +1 with
// amsgrad). All state is fp32, 4 bytes a value. Bytes one rank holds:
//
//   stage  params           grads            optimizer   working set
//   0      4Ψ               4Ψ               4kΨ         4Ψ: DataParallel's bucket mirror of
//                                                        every gradient, alive all step
//   1      4Ψp (views into  4Ψ (each .grad)  4kΨp/N      4Ψp/N grad shards, filled by the last
//          unit flats)                                   micro-batch's reduce-scatter and read
//                                                        by the step; 2 buckets in flight
//   2      4Ψp              4Ψp/N (shards)   4kΨp/N      2 buckets in flight; the .grad of one
//                                                        unit not yet copied into its bucket
//   3      4Ψp/N (master    4Ψp/N            4kΨp/N      gathered flats of the root and of
//          shards)                                       1 + prefetch units (4·(root + (1+p)Ψmax)),
//                                                        one unit's full grad and bucket (8Ψmax)
//                                                        and the root's full grad (4·root), or at
//                                                        the root's reduce its flat, grad and
//                                                        bucket, whichever is larger
//
// A bucket holds at most max(bucket_bytes, one padded unit) bytes (a unit larger than the cap
// is a bucket of its own). With Adam and no padding the model state (params + grads +
// optimizer) is the 16Ψ, 4Ψ + 4Ψ + 8Ψ/N, 4Ψ + 12Ψ/N and 16Ψ/N; the stage-1 grad shards
// are counted as working set because they live only from the last backward to the step.
// Padding adds less than N·A elements per unit to Ψp.
//
// Further terms, each its own field so a message can name what dominates:
//   low_precision  bf16: the bf16 weight copies autograd saves for backward, 2Ψ; stage 3 with
//                  activation checkpointing confines them to the root and one unit (§6.1).
//   compression    a compressor with error feedback: its full-size first-level residual 4Ψ and
//                  the second-level one, 4Ψ/N (§2.2).
//   comm_buffers   temporaries of the collectives, which no engine tensor shows: stage 0,
//                  Gloo's ring all-reduce scratch (under one bucket); stages 1-2, the larger
//                  of the backward's (a third bucket filling while two are in flight, and the
//                  staging buffer krab's Gloo reduce-scatter (an all-to-all) receives each
//                  bucket into: 3 buckets) and the all-gathers' after the step (the shard
//                  copies they send from, 4Ψp/N, and c10d's output temporary of the one gather
//                  running, a padded unit: ProcessGroupGloo allgathers into a flat tensor and
//                  copies out, on krab's single progress thread); stage 3, two more one-unit
//                  buckets in flight than the working set counts, their staging buffers and
//                  the running gather's temporary (5 units and 2 shards).
//   activations    passed through: the caller's estimate for its model and batch.
//   evaluation     evaluation runs without gradients and with its own batches
//                  (evaluation_activation_bytes). Workers of every stage keep freed memory
//                  in the heap (krab's heap settings; stage 3's unit flats come from a pool
//                  of their own, parallel/zero/flat_pool.h, already in the working set),
//                  where evaluation's tensors rarely fit the holes the step left: the whole
//                  estimate adds. This term follows the workers' allocator policy
//                  (train/engines.cpp, cli/main.cpp): if that changes, so must it.
//   offloaded      parallel.offload: disk moves the optimizer state (and stage 3's master
//                  shards) into a file; RAM keeps a window of two units of it (§6.2).
//   ward           shard replication (replicate_shards, elastic membership: buddy.h), stages
//                  1-3 on N >= 2: the copy of the previous rank's shard — its gradient shard
//                  4Ψp/N (received after the reduce, dropped by the step), its optimizer
//                  state 4kΨp/N and at stage 3 its master 4Ψp/N; 0 otherwise. Exactly what
//                  the engines' ShardBuddy::bytes() measures after a step. Not with offload.
// Not counted: buffers (replicated, small), Adam's per-tensor step counters, LibTorch's process
// overhead and the data set (worker_peak_bytes below adds those).
//
// Traffic per step (zero_traffic), with M micro-batches, P_u = 4·padded_u bytes and the wire
// bytes of comm/traffic.h (AR = all-reduce, RS = reduce-scatter, AG = all-gather):
//   0   AR of the unpadded gradients once (DataParallel reduces on the last micro-batch), as
//       one op: DataParallel's meter rounds each bucket down, so it may read up to one byte
//       per bucket less
//   1   per unit RS(P_u) on the last micro-batch, AG(P_u/N) after the step
//       = AR of the padded sizes, since (N-1)/N·P + (N-1)·P/N = 2(N-1)/N·P
//   2   per unit RS(P_u) every micro-batch, AG(P_u/N) after the step
//   3   per micro-batch: every non-root unit AG (forward) + AG (backward) + RS, except that the
//       last unit in forward order is still gathered when backward reaches it (no backward AG);
//       the root RS; the root's AG once per step, after it (the root stays gathered: its
//       values change only at the step)
// With replicate_shards (stages 1-3, N >= 2) every non-empty unit also sends its gradient
// shard (P_u/N) to the buddy once per step and receives one (a recv counts 0 bytes): 4Ψp/N.
// So stage 3 sends 3 units' worth where stage 1 sends 2: 1.5x all-reduce's bytes as the units
// grow in number. Gathers are fp32 at every precision (§6.1). A unit of 0 elements issues no
// collective. Compressed reduce-scatters and the buffer broadcast are not modelled.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/traffic.h"

namespace krab::parallel::zero {

enum class OptimizerKind { kSgd, kSgdMomentum, kAdam, kAdamW };
enum class Precision { kFp32, kBf16 };
enum class Offload { kNone, kDisk };

// Everything the prediction depends on. Plain value.
struct MemoryInputs {
  // Trainable parameter count of each unit; [0] is the root unit (may be 0), the rest in
  // forward order. Must not be empty; every entry >= 0.
  std::vector<int64_t> unit_numel;
  int world_size = 1;      // N >= 1
  int stage = 0;           // 0..3
  int64_t alignment = 16;  // A in elements, >= 1: lcm(16, the codec chunk), §1.2
  OptimizerKind optimizer = OptimizerKind::kAdam;
  bool amsgrad = false;  // Adam / AdamW only: a third moment
  Precision precision = Precision::kFp32;
  Offload offload = Offload::kNone;  // kDisk needs stage >= 1
  bool activation_checkpointing = false;
  int prefetch = 1;                 // stage 3: units gathered ahead, >= 0
  int64_t bucket_bytes = 25 << 20;  // the bucket cap, > 0
  bool error_feedback = false;      // a compressor with error feedback residuals
  int64_t activation_bytes = 0;     // the caller's activation estimate, >= 0
  // The caller's estimate of evaluation's forward pass (no gradients, larger batches), >= 0;
  // 0 when the job evaluates nothing.
  int64_t evaluation_activation_bytes = 0;
  int micro_batches = 1;  // gradient accumulation steps, >= 1 (traffic only)
  // elastic.replicate_shards: the ward term and the buddy's sends (buddy.h). Needs stage >= 1
  // and offload none.
  bool replicate_shards = false;
};

// Bytes one rank holds, by kind. Plain value.
struct MemoryPrediction {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;  // resident part: all of it, or the offload window
  int64_t working_set = 0;
  int64_t comm_buffers = 0;  // temporaries of the collectives, see above
  int64_t low_precision = 0;
  int64_t compression = 0;
  int64_t activations = 0;
  int64_t evaluation = 0;  // evaluation's bytes beyond the training step's, see above
  int64_t heap = 0;        // the allocator's slack over all of the above: kHeapSlackDivisor
  int64_t offloaded = 0;   // on disk, not in RAM
  int64_t ward = 0;        // the copy of the ward's shard (replicate_shards), see above
  // params + grads + optimizer: the "model state" (of this rank's own shard).
  int64_t model_state() const { return params + grads + optimizer; }
  // Everything in RAM: all fields but `offloaded`.
  int64_t resident() const {
    return model_state() + working_set + comm_buffers + low_precision + compression + activations +
           evaluation + ward + heap;
  }
};

// `heap` is the rest of the resident bytes divided by this (5%): freed blocks glibc keeps (krab's
// trim threshold is 1 GiB) that later allocations of other sizes do not reuse, and arena
// padding. Measured (VmHWM against the other terms' sum, gpt, Debian 12's LibTorch 1.13 on the
// 2-core AMD EPYC, 2026-12-07): stage 0, 57.1 M parameters on 4 workers +2.0-2.4%, 191.9 M on
// 2 workers +2.1-4.0% and on 4 workers +4.3%; stage 3 + checkpointing + bf16, 772.1 M on 4
// workers +4.2%. Without it the check let a 236.8 M stage-0 run start under a 5 GiB cap that
// the OOM killer then ended (docs/benchmarks.md §11).
constexpr int64_t kHeapSlackDivisor = 20;

// What a worker holds besides the prediction, for the launcher's check (cli/resources.h) and the
// report, which compare worker_peak_bytes with the budget and with the measured VmHWM:
//   kWorkerProcessBytes  LibTorch's process (libraries, allocator arenas, thread pools, the
//                        communicator): a worker with nearly no data and model peaked at
//                        172 MiB (an mlp; VmHWM, Debian 12's LibTorch 1.13) and a 2-worker gpt
//                        of width 32 at 191-198 MiB, of which 15-17 MiB was its predicted
//                        model part: 176-181 MiB, rounded up.
//   kDataCopies          every worker loads the whole data set and holds about twice its
//                        tensors while loading (the raw file and its float copy).
constexpr int64_t kWorkerProcessBytes = int64_t{192} << 20;
constexpr int64_t kDataCopies = 2;

// A worker's predicted peak resident bytes: the process, kDataCopies of its data tensors
// (`data_bytes`) and everything `m` keeps in RAM. Pure.
inline int64_t worker_peak_bytes(const MemoryPrediction& m, int64_t data_bytes) {
  return kWorkerProcessBytes + kDataCopies * data_bytes + m.resident();
}

// fp32 values the optimizer keeps per parameter: 0, 1, 2 or 3 (the k above).
int optimizer_values_per_param(OptimizerKind kind, bool amsgrad);

// padded_u for one unit: numel rounded up to a multiple of world_size · alignment. Pure; it is
// engine::padded_numel, the rounding plan_layout pads with (§1.2), so the bytes predicted for
// a layout are the bytes its flats hold.
int64_t padded_numel(int64_t numel, int world_size, int64_t alignment);

// The table above for `in`. Pure; throws InvalidArgument naming the field when an input is out
// of range (and for offload at stage 0, which has no shards to offload).
MemoryPrediction predict_memory(const MemoryInputs& in);

// Bytes and ops one rank sends in one optimizer step of `in.micro_batches` micro-batches, per op
// kind, as Communicator::traffic() would record them (comm/traffic.h); the fields of `in` that
// only concern memory are ignored. Pure; throws like predict_memory.
comm::TrafficStats zero_traffic(const MemoryInputs& in);

}  // namespace krab::parallel::zero
