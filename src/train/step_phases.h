// The spans a training step is made of, as the loop (train/trainer.cpp) emits them through
// core/events.h, and what the trace, the monitoring endpoint and the bottleneck report
// (train/bottleneck.h) read of them.
//
//   step                    one whole step, from its first batch to the end of its end
//     step.data             the batch: gathered, or waited for from the prefetcher
//     step.forward          forward and loss, one per micro-batch
//     step.backward         backward (launching the buckets whose gradients are complete),
//                           the artificial straggler's delay included (train.slow_rank)
//     step.reduce           Engine::reduce_gradients(): waiting for the reductions still in
//                           flight (what backward did not hide) and for the slowest rank
//     step.optimizer        Engine::apply(): the update
//     step.after            Engine::after_step(): local SGD's average, the buffers' broadcast
//     step.end              the loop's end of a step: shared loss, checkpoint, evaluation
//       step.loss           the all-reduce of the step's loss (at the steps it is shown)
//   comm.bucket.<b>         bucket b's reduction, launch to wait (Engine::step_spans();
//                           runs alongside step.backward and step.reduce)
//   evaluation, checkpoint  inside step.end when they run
//   membership              an elastic change of generation (Engine::recover)
//
// Spans nest in time on one rank, except comm.* which overlap the step's phases (a trace
// draws them on their own track).
#pragma once

namespace krab::train::phase {

inline constexpr const char* kStep = "step";
inline constexpr const char* kData = "step.data";
inline constexpr const char* kForward = "step.forward";
inline constexpr const char* kBackward = "step.backward";
inline constexpr const char* kReduce = "step.reduce";
inline constexpr const char* kOptimizer = "step.optimizer";
inline constexpr const char* kAfter = "step.after";
inline constexpr const char* kEnd = "step.end";
inline constexpr const char* kLoss = "step.loss";
inline constexpr const char* kEvaluation = "evaluation";
inline constexpr const char* kCheckpoint = "checkpoint";
inline constexpr const char* kMembership = "membership";
inline constexpr const char* kBucketPrefix = "comm.bucket.";

}  // namespace krab::train::phase
