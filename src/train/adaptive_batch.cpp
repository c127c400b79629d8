#include "train/adaptive_batch.h"

#include <torch/torch.h>

#include <cmath>

#include "comm/communicator.h"
#include "core/errors.h"

namespace krab::train {

namespace {

const char* const kMin = "train.adaptive_batch.min";
const char* const kMax = "train.adaptive_batch.max";

// Checkpoint state: a version, the noise averages, then five numbers per segment.
constexpr double kStateVersion = 1;
constexpr size_t kHead = 6;  // version, segments, g_sq, trace, weight, steps
constexpr size_t kPerSegment = 4;
// Steps and micro-batches in a checkpoint are integers well below this (2^50): larger ones are
// corrupt, and products of two of them must not overflow int64.
constexpr double kLargest = 1125899906842624.0;

int64_t whole(double v, const std::string& what, const std::string& source) {
  if (!std::isfinite(v) || v < 0 || v > kLargest || v != std::floor(v))
    throw CorruptData(str_cat("checkpoint '", source, "': adaptive batch ", what, " is ", v));
  return static_cast<int64_t>(v);
}

}  // namespace

void check_adaptive_batch_options(const core::Config& c, int workers) {
  if (c.get_int(kMax) == 0) return;
  const auto refuse = [&](bool ok, const std::string& key, const std::string& value) {
    KRAB_CHECK_ARG(ok, kMax, " ", c.get_int(kMax), " cannot be combined with ", key, ": ", value);
  };
  refuse(workers >= 2, "parallel.workers",
         str_cat(workers,
                 " (the gradient noise scale needs each worker's gradient and their "
                 "average: use 2 or more workers)"));
  refuse(c.get_string("sync.mode") == "sync", "sync.mode", c.get_string("sync.mode"));
  refuse(c.get_int("parallel.zero_stage") == 0, "parallel.zero_stage",
         std::to_string(c.get_int("parallel.zero_stage")));
  const std::string& codec = c.get_string("comm.compression");
  refuse(codec == "none" || codec == "fp16" || codec == "bf16", "comm.compression",
         codec +
             " (the noise scale reads the averaged gradient's norm, which a lossy codec "
             "changes; none, fp16 and bf16 can)");
  refuse(!c.get_bool("elastic.enabled"), "elastic.enabled", "true (not built yet)");
  refuse(c.get_int("train.grad_accum") == 1, "train.grad_accum",
         str_cat(c.get_int("train.grad_accum"),
                 " (the adaptive batch accumulates micro-batches itself: leave it at 1)"));
  const int64_t micro = c.get_int("data.batch_size") * workers;
  const std::string what = str_cat("the global micro-batch ", micro, " (data.batch_size ",
                                   c.get_int("data.batch_size"), " x ", workers, " workers)");
  const int64_t min = c.get_int(kMin) > 0 ? c.get_int(kMin) : micro;
  const int64_t max = c.get_int(kMax);
  KRAB_CHECK_ARG(min % micro == 0, kMin, " ", min, " is not a multiple of ", what);
  KRAB_CHECK_ARG(max % micro == 0, kMax, " ", max, " is not a multiple of ", what);
  KRAB_CHECK_ARG(max >= min, kMax, " ", max, " is below ", kMin, " ", min);
}

std::optional<AdaptiveBatchOptions> AdaptiveBatchOptions::from_config(const core::Config& c,
                                                                      int workers,
                                                                      int64_t train_examples) {
  if (c.get_int(kMax) == 0) return std::nullopt;
  check_adaptive_batch_options(c, workers);
  AdaptiveBatchOptions o;
  o.micro = c.get_int("data.batch_size") * workers;
  const int64_t max = c.get_int(kMax);
  KRAB_CHECK_ARG(max <= train_examples, kMax, " ", max, " is more than the ", train_examples,
                 " training examples of the data (a step would see an example twice)");
  o.min_micro = (c.get_int(kMin) > 0 ? c.get_int(kMin) : o.micro) / o.micro;
  o.max_micro = max / o.micro;
  o.overhead_examples = c.get_float("train.adaptive_batch.overhead_examples");
  o.sqrt_gain = c.get_string("train.optimizer.name") != "sgd";
  return o;
}

double adascale_gain(double noise_scale, int64_t min_batch, int64_t batch) {
  if (noise_scale <= 0) return 1.0;
  return (noise_scale / static_cast<double>(min_batch) + 1) /
         (noise_scale / static_cast<double>(batch) + 1);
}

int64_t choose_micro_batches(const AdaptiveBatchOptions& o, double noise_scale,
                             double overhead_examples, int64_t current) {
  // Progress per second of k micro-batches, up to the constant c: r(B) / (a/c + B).
  const auto goodput = [&](int64_t k) {
    return adascale_gain(noise_scale, o.min_micro * o.micro, k * o.micro) /
           (overhead_examples + static_cast<double>(k * o.micro));
  };
  int64_t best = current;
  for (int64_t k = o.min_micro; k <= o.max_micro; ++k)
    if (goodput(k) > goodput(best)) best = k;
  return goodput(best) > 1.02 * goodput(current) ? best : current;
}

double AdaptiveBatch::lr_gain(int64_t step) const {
  const BatchSegment& s = schedule_.segment(step);
  const double gain = adascale_gain(s.noise_scale, o_.min_micro * o_.micro,
                                    schedule_.micro_batches(step) * o_.micro);
  return o_.sqrt_gain ? std::sqrt(gain) : gain;
}

void AdaptiveBatch::observe_gradients(double small_sq, int64_t small_batch, double big_sq,
                                      int64_t big_batch) {
  noise_.add(small_sq, small_batch, big_sq, big_batch);
}

void AdaptiveBatch::observe_time(int64_t step, int64_t first_step, double compute_s, double step_s,
                                 int64_t micro_batches) {
  if (step < first_step + kSettleSteps || micro_batches <= 0 || micro_batches > o_.max_micro)
    return;
  if (compute_sum_.empty()) {
    compute_sum_.assign(static_cast<size_t>(o_.max_micro + 1), 0.0);
    compute_steps_.assign(static_cast<size_t>(o_.max_micro + 1), 0.0);
  }
  window_overhead_ += std::max(0.0, step_s - compute_s);
  ++window_steps_;
  compute_sum_[static_cast<size_t>(micro_batches)] += compute_s;
  compute_steps_[static_cast<size_t>(micro_batches)] += 1;
}

std::optional<double> fitted_overhead(int64_t micro, const std::vector<double>& compute_sums,
                                      const std::vector<double>& steps, double outside) {
  // Least squares of the mean compute time of a step against its examples, each count
  // weighted by its steps.
  double w = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  int counts = 0;
  for (size_t k = 1; k < steps.size() && k < compute_sums.size(); ++k) {
    if (steps[k] <= 0) continue;
    const double x = static_cast<double>(static_cast<int64_t>(k) * micro);
    const double y = compute_sums[k] / steps[k];
    w += steps[k];
    sx += steps[k] * x;
    sy += steps[k] * y;
    sxx += steps[k] * x * x;
    sxy += steps[k] * x * y;
    ++counts;
  }
  if (counts == 0) return std::nullopt;
  double alpha = 0, beta = sy / sx;  // one count: a line through 0
  if (counts >= 2) {
    beta = (w * sxy - sx * sy) / (w * sxx - sx * sx);
    alpha = (sy - beta * sx) / w;
    if (alpha < 0 || beta <= 0) alpha = 0, beta = sy / sx;  // noise: back to the line through 0
  }
  if (!(beta > 0)) return std::nullopt;
  return (outside + alpha) / beta;
}

std::optional<double> AdaptiveBatch::measured_overhead(const std::vector<double>& v) const {
  // v: window overhead, window steps, then per count k = 0..max: compute sums, then steps.
  const auto n = static_cast<std::ptrdiff_t>(o_.max_micro + 1);
  if (v[1] <= 0) return std::nullopt;
  return fitted_overhead(o_.micro, {v.begin() + 2, v.begin() + 2 + n},
                         {v.begin() + 2 + n, v.begin() + 2 + 2 * n}, v[0] / v[1]);
}

void AdaptiveBatch::maybe_decide(int64_t step, comm::Communicator& group) {
  // At the last step too: a run that ends there and is resumed with more steps goes on with the
  // batch the uninterrupted run chose (its checkpoint holds the segment).
  if ((step + 1) % kDecideEvery != 0) return;
  const NoiseScale::State n = noise_.state();
  const bool timed = o_.overhead_examples <= 0;
  // The smoothed estimates of |G|² and tr(Σ) (bias-corrected) and the timings, averaged over
  // ranks: every rank then decides on the same numbers.
  std::vector<double> v{n.weight > 0 ? n.g_sq / n.weight : 0.0,
                        n.weight > 0 ? n.trace / n.weight : 0.0, window_overhead_,
                        static_cast<double>(window_steps_)};
  if (timed) {
    const size_t slots = static_cast<size_t>(o_.max_micro + 1);
    const std::vector<double> none(slots, 0.0);
    const std::vector<double>& sums = compute_sum_.empty() ? none : compute_sum_;
    const std::vector<double>& steps = compute_steps_.empty() ? none : compute_steps_;
    v.insert(v.end(), sums.begin(), sums.end());
    v.insert(v.end(), steps.begin(), steps.end());
  }
  auto all = torch::tensor(at::ArrayRef<double>(v), torch::kFloat64);
  group.allreduce(all, comm::ReduceOp::kAvg)->wait();
  std::copy(all.data_ptr<double>(), all.data_ptr<double>() + all.numel(), v.begin());
  window_overhead_ = 0;
  window_steps_ = 0;
  const double g_sq = v[0], trace = v[1];
  if (g_sq <= 0 || trace <= 0 || noise_.steps() < kDecideEvery) return;
  const double noise_scale = trace / g_sq;
  const int64_t current = schedule_.segment(step).micro_batches;
  std::optional<double> ratio = o_.overhead_examples;
  bool explore = false;
  if (timed) {
    ratio = measured_overhead({v.begin() + 2, v.end()});
    if (!ratio) return;  // nothing timed yet
    // One count measured: a window at the next one gives the fit its second point.
    int counts = 0;
    for (int64_t k = 1; k <= o_.max_micro; ++k) counts += v[4 + o_.max_micro + 1 + k] > 0;
    explore = counts < 2 && !explored_ && current < o_.max_micro;
  }
  const int64_t next =
      explore ? current + 1 : choose_micro_batches(o_, noise_scale, *ratio, current);
  explored_ = explored_ || explore;
  decisions_.push_back({{"step", step + 1},
                        {"noise_scale", noise_scale},
                        {"overhead_examples", *ratio},
                        {"batch", next * o_.micro},
                        {"explore", explore}});
  if (next != current) schedule_.append({step + 1, 0, next, noise_scale});
}

std::vector<double> AdaptiveBatch::save() const {
  const NoiseScale::State n = noise_.state();
  std::vector<double> out{kStateVersion, static_cast<double>(schedule_.segments().size()),
                          n.g_sq,        n.trace,
                          n.weight,      static_cast<double>(n.steps)};
  for (const BatchSegment& s : schedule_.segments()) {
    out.push_back(static_cast<double>(s.first_step));
    out.push_back(static_cast<double>(s.first_micro));
    out.push_back(static_cast<double>(s.micro_batches));
    out.push_back(s.noise_scale);
  }
  return out;
}

void AdaptiveBatch::restore(const std::vector<double>& state, const std::string& source) {
  if (state.size() < kHead || state[0] != kStateVersion)
    throw CorruptData(str_cat("checkpoint '", source, "': not an adaptive batch state"));
  const int64_t count = whole(state[1], "segment count", source);
  if (count < 1 || state.size() != kHead + static_cast<size_t>(count) * kPerSegment)
    throw CorruptData(str_cat("checkpoint '", source, "': adaptive batch state of ", state.size(),
                              " numbers for ", count, " segments"));
  NoiseScale::State n{state[2], state[3], state[4], whole(state[5], "noise steps", source)};
  if (!std::isfinite(n.g_sq) || !std::isfinite(n.trace) || !(n.weight >= 0 && n.weight <= 1))
    throw CorruptData(str_cat("checkpoint '", source, "': adaptive batch noise averages"));
  std::vector<BatchSegment> segments;
  for (int64_t k = 0; k < count; ++k) {
    const double* s = state.data() + kHead + k * kPerSegment;
    const int64_t micro = whole(s[2], "micro-batches", source);
    if (micro < o_.min_micro || micro > o_.max_micro || !std::isfinite(s[3]) || s[3] < 0)
      throw CorruptData(str_cat("checkpoint '", source, "': adaptive batch segment ", k, " has ",
                                micro, " micro-batches (this job's bounds: ", o_.min_micro, " to ",
                                o_.max_micro, ")"));
    segments.push_back(
        {whole(s[0], "step", source), whole(s[1], "micro-batch", source), micro, s[3]});
  }
  try {
    schedule_.restore(std::move(segments));
  } catch (const InvalidArgument& e) {
    throw CorruptData(str_cat("checkpoint '", source, "': ", e.what()));
  }
  noise_.set_state(n);
}

nlohmann::json AdaptiveBatch::describe() const {
  nlohmann::json changes = nlohmann::json::array();
  for (const BatchSegment& s : schedule_.segments())
    changes.push_back({{"step", s.first_step},
                       {"examples_before", s.first_micro * o_.micro},
                       {"batch", s.micro_batches * o_.micro},
                       {"noise_scale", s.noise_scale}});
  return {{"min", o_.min_micro * o_.micro},
          {"max", o_.max_micro * o_.micro},
          {"micro_batch", o_.micro},
          {"changes", changes},
          {"decisions", decisions_}};
}

}  // namespace krab::train
