#include "monitor/exposition.h"

#include <charconv>
#include <cmath>
#include <utility>

#include "train/bottleneck.h"
#include "train/step_phases.h"

namespace krab::monitor {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// One metric family: its HELP and TYPE lines and the samples gathered for it. Rendered only
// when it holds a sample, so that an absent measurement reads as absent rather than as 0.
class Family {
 public:
  Family(std::string name, const char* type, const char* help)
      : name_(std::move(name)), type_(type), help_(help) {}

  void add(const Labels& labels, double value, const std::string& suffix = "") {
    samples_ += name_ + suffix;
    if (!labels.empty()) {
      samples_ += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        if (i > 0) samples_ += ',';
        samples_ += labels[i].first + "=\"" + escape_label(labels[i].second) + '"';
      }
      samples_ += '}';
    }
    samples_ += ' ' + format_value(value) + '\n';
  }

  void render(std::string& out) const {
    if (samples_.empty()) return;
    // HELP texts are krab's own: no backslash or line feed to escape.
    out += "# HELP " + name_ + ' ' + help_ + '\n';
    out += "# TYPE " + name_ + ' ' + type_ + '\n';
    out += samples_;
  }

 private:
  std::string name_;
  const char* type_;
  const char* help_;
  std::string samples_;
};

// The phases shown, in the order of a step; the label drops step_phases.h's "step." prefix.
// The whole step is krab_train_step_seconds_sum.
constexpr std::pair<const char*, const char*> kPhaseLabels[] = {
    {train::phase::kData, "data"},
    {train::phase::kForward, "forward"},
    {train::phase::kBackward, "backward"},
    {train::phase::kReduce, "reduce"},
    {train::phase::kOptimizer, "optimizer"},
    {train::phase::kAfter, "after"},
    {train::phase::kEnd, "end"},
    {train::phase::kEvaluation, "evaluation"},
    {train::phase::kCheckpoint, "checkpoint"},
    {train::phase::kMembership, "membership"}};

constexpr const char* kCommPrefix = "comm.bytes.";

void per_rank_families(const std::vector<Snapshot>& ranks, const std::string& node,
                       std::string& out) {
  Family samples("krab_train_samples_total", "counter", "Examples this rank computed.");
  Family steps("krab_train_steps_total", "counter", "Training steps this rank computed.");
  Family hist("krab_train_step_seconds", "histogram", "Seconds of one training step.");
  Family phases("krab_train_phase_seconds_total", "counter",
                "Seconds this rank spent in each phase of its steps.");
  Family comm("krab_comm_bytes_total", "counter",
              "Bytes this rank's collectives sent, per collective op.");
  Family loss("krab_train_loss", "gauge", "Training loss of the global batch, last shared.");
  Family rate("krab_train_samples_per_second", "gauge",
              "Examples per second of the whole job since the warm-up.");
  Family acc("krab_train_test_accuracy", "gauge", "Test accuracy at the last evaluation.");
  Family test_loss("krab_train_test_loss", "gauge", "Test loss at the last evaluation.");
  Family rss("krab_memory_rss_bytes", "gauge", "Resident memory of this rank's process.");
  Family noise("krab_train_gradient_noise_scale", "gauge",
               "This rank's estimate of the gradient noise scale B_simple, in examples.");
  Family batch(
      "krab_train_global_batch", "gauge",
      "Examples in the global batch a step takes (train.adaptive_batch: the last chosen).");
  for (const Snapshot& s : ranks) {
    const Labels who{{"node", node}, {"rank", std::to_string(s.rank)}};
    const auto counter = s.counters.find("samples");
    samples.add(who, counter != s.counters.end() ? counter->second : 0);
    steps.add(who, static_cast<double>(s.steps));
    for (size_t i = 0; i < kStepBuckets.size(); ++i) {
      Labels le = who;
      le.emplace_back("le", format_value(kStepBuckets[i]));
      hist.add(le, static_cast<double>(s.step_counts[i]), "_bucket");
    }
    Labels inf = who;
    inf.emplace_back("le", "+Inf");
    hist.add(inf, static_cast<double>(s.step_count), "_bucket");
    hist.add(who, s.step_sum, "_sum");
    hist.add(who, static_cast<double>(s.step_count), "_count");
    for (const auto& [span, label] : kPhaseLabels)
      if (auto it = s.phases.find(span); it != s.phases.end()) {
        Labels l = who;
        l.emplace_back("phase", label);
        phases.add(l, it->second);
      }
    for (const auto& [name, bytes] : s.counters)
      if (name.rfind(kCommPrefix, 0) == 0) {
        Labels l = who;
        l.emplace_back("op", name.substr(std::char_traits<char>::length(kCommPrefix)));
        comm.add(l, bytes);
      }
    const std::pair<Family*, const char*> gauges[] = {
        {&loss, "loss"},           {&rate, "samples_per_sec"},       {&acc, "test_accuracy"},
        {&test_loss, "test_loss"}, {&noise, "gradient_noise_scale"}, {&batch, "global_batch"}};
    for (const auto& [family, name] : gauges)
      if (auto it = s.gauges.find(name); it != s.gauges.end()) family->add(who, it->second);
    rss.add(who, static_cast<double>(s.rss_bytes));
  }
  for (const Family* f : {&samples, &steps, &hist, &phases, &comm, &loss, &rate, &acc, &test_loss,
                          &rss, &noise, &batch})
    f->render(out);
}

// Membership is the job's, but only the ranks that lived through a change know it: the
// newest snapshot that holds the gauge speaks for the node.
void elastic_families(const std::vector<Snapshot>& ranks, const std::string& node,
                      std::string& out) {
  const std::pair<const char*, const char*> kGauges[] = {
      {"workers", "Workers in the current generation of an elastic run."},
      {"generation", "Generation number of an elastic run's membership."}};
  for (const auto& [gauge, help] : kGauges) {
    const Snapshot* newest = nullptr;
    for (const Snapshot& s : ranks)
      if (s.gauges.count(gauge) && (newest == nullptr || s.unix_time > newest->unix_time))
        newest = &s;
    if (newest == nullptr) continue;
    Family f(std::string("krab_elastic_") + gauge, "gauge", help);
    f.add({{"node", node}}, newest->gauges.at(gauge));
    f.render(out);
  }
}

// train::bottleneck_report over this node's ranks, from each one's totals since its start.
void bottleneck_families(const std::vector<Snapshot>& ranks, const std::string& node,
                         std::string& out) {
  using P = train::PhaseTotals;
  constexpr std::pair<const char*, int> kTotals[] = {{train::phase::kData, P::kData},
                                                     {train::phase::kForward, P::kForward},
                                                     {train::phase::kBackward, P::kBackward},
                                                     {train::phase::kReduce, P::kReduce},
                                                     {train::phase::kOptimizer, P::kOptimizer},
                                                     {train::phase::kAfter, P::kAfter},
                                                     {train::phase::kEnd, P::kEnd},
                                                     {train::phase::kStep, P::kStep}};
  std::vector<P> totals;
  for (const Snapshot& s : ranks) {
    if (s.rank < 0) continue;
    if (static_cast<size_t>(s.rank) >= totals.size()) totals.resize(s.rank + 1);
    P& t = totals[s.rank];
    for (const auto& [span, index] : kTotals)
      if (auto it = s.phases.find(span); it != s.phases.end()) t.seconds[index] = it->second;
    t.steps = s.step_count;
  }
  const nlohmann::json report = train::bottleneck_report(totals, train::RunShape{});
  if (report.is_null()) return;
  Family share("krab_bottleneck_share", "gauge",
               "Fraction of this rank's mean step time in each share (train/bottleneck.h).");
  for (const auto& row : report["ranks"])
    for (const char* k : {"compute", "communication", "waiting", "data", "optimizer", "other"})
      share.add({{"node", node}, {"rank", std::to_string(row["rank"].get<int>())}, {"share", k}},
                row[k].get<double>());
  share.render(out);
  Family slowest("krab_bottleneck_slowest_rank", "gauge",
                 "The rank of this node with the most computation, data and update per step.");
  slowest.add({{"node", node}}, report["slowest_rank"].get<double>());
  slowest.render(out);
}

}  // namespace

std::string escape_label(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  return std::string(buf, end);
}

void FlRounds::add(const FlRound& r) {
  ++rounds;
  if (!r.ok) ++failed;
  last_round = r.round;
  available = r.available;
  cohort = r.cohort;
  counted = r.counted;
  dropped = r.dropped;
  rejected = r.rejected;
  bytes_down += r.bytes_down;
  bytes_up += r.bytes_up;
  seconds += r.seconds;
  if (r.mean_loss) mean_loss = r.mean_loss;
  if (r.test_accuracy) test_accuracy = r.test_accuracy;
  if (r.test_loss) test_loss = r.test_loss;
  if (r.epsilon) epsilon = r.epsilon;
}

std::string render_fl_metrics(const FlRounds& r) {
  std::string out;
  Family rounds("krab_fl_rounds_total", "counter", "Federated rounds this server ran.");
  rounds.add({}, static_cast<double>(r.rounds));
  Family failed("krab_fl_rounds_failed_total", "counter", "Federated rounds that failed.");
  failed.add({}, static_cast<double>(r.failed));
  Family last("krab_fl_round", "gauge", "Number of the last federated round run.");
  if (r.last_round >= 0) last.add({}, static_cast<double>(r.last_round));
  Family clients("krab_fl_clients", "gauge", "Clients of the last round, by state.");
  if (r.last_round >= 0)
    for (const auto& [state, n] : {std::pair<const char*, int64_t>{"available", r.available},
                                   {"cohort", r.cohort},
                                   {"counted", r.counted},
                                   {"dropped", r.dropped},
                                   {"rejected", r.rejected}})
      clients.add({{"state", state}}, static_cast<double>(n));
  Family bytes("krab_fl_bytes_total", "counter", "Payload bytes of the rounds, per direction.");
  bytes.add({{"direction", "down"}}, r.bytes_down);
  bytes.add({{"direction", "up"}}, r.bytes_up);
  Family seconds("krab_fl_round_seconds_total", "counter", "Seconds spent in rounds.");
  seconds.add({}, r.seconds);
  Family loss("krab_fl_train_loss", "gauge", "Clients' mean training loss, last round.");
  Family acc("krab_fl_test_accuracy", "gauge", "Test accuracy at the last evaluation.");
  Family test_loss("krab_fl_test_loss", "gauge", "Test loss at the last evaluation.");
  Family eps("krab_fl_privacy_epsilon", "gauge", "Differential privacy's epsilon spent so far.");
  const std::pair<Family*, const std::optional<double>*> gauges[] = {{&loss, &r.mean_loss},
                                                                     {&acc, &r.test_accuracy},
                                                                     {&test_loss, &r.test_loss},
                                                                     {&eps, &r.epsilon}};
  for (const auto& [family, value] : gauges)
    if (value->has_value()) family->add({}, **value);
  for (const Family* f :
       {&rounds, &failed, &last, &clients, &bytes, &seconds, &loss, &acc, &test_loss, &eps})
    f->render(out);
  return out;
}

std::string render_metrics(const std::vector<Snapshot>& ranks, const std::string& node) {
  std::string out;
  per_rank_families(ranks, node, out);
  elastic_families(ranks, node, out);
  bottleneck_families(ranks, node, out);
  return out;
}

}  // namespace krab::monitor
