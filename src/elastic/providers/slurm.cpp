#include "elastic/providers/slurm.h"

#include <cstdio>
#include <set>
#include <sstream>
#include <thread>

#include "core/errors.h"
#include "elastic/providers/command.h"

namespace krab::elastic {

namespace {

// Jobs whose worker may still run (or has yet to start).
bool active(const std::string& state) {
  static const std::set<std::string> kActive = {"PENDING",  "CONFIGURING", "RUNNING",  "SUSPENDED",
                                                "REQUEUED", "RESIZING",    "SIGNALING"};
  return kActive.count(state) > 0;
}

std::string joined(const std::vector<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) out += (out.empty() ? "" : ",") + id;
  return out;
}

// The command as an error message shows it: the wrapped worker command line is long and says
// nothing about why sbatch failed.
std::string shown(const std::vector<std::string>& argv) {
  std::string out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (i > 0 && argv[i - 1] == "--wrap") {
      out += " \"exec krab ...\"";
      continue;
    }
    const size_t slash = i == 0 ? argv[i].rfind('/') : std::string::npos;
    out += (i ? " " : "") + (slash == std::string::npos ? argv[i] : argv[i].substr(slash + 1));
  }
  return out;
}

}  // namespace

SlurmClients find_slurm_clients(const std::string& path) {
  SlurmClients c;
  for (auto [name, at] : {std::pair{"sbatch", &c.sbatch}, std::pair{"scancel", &c.scancel},
                          std::pair{"sinfo", &c.sinfo}, std::pair{"squeue", &c.squeue}}) {
    *at = find_in_path(name, path);
    KRAB_CHECK_ARG(!at->empty(), "elastic.autoscale.provider slurm: ", name,
                   " is not in PATH: slurm-wlm's client is not installed; or provider: local");
  }
  return c;
}

int check_slurm_controller(const SlurmClients& clients, const std::vector<std::string>& env,
                           std::chrono::milliseconds timeout) {
  const std::vector<std::string> argv = {clients.sinfo, "-h", "-o", "%C"};
  const CommandResult r = run_command(argv, env, timeout);
  std::optional<int> idle = r.status == 0 ? parse_idle_cpus(r.out) : std::nullopt;
  if (idle) return *idle;
  std::string line = first_line(r.err);
  if (line.empty()) line = first_line(r.out);
  if (r.timed_out) line = str_cat("sinfo did not answer in ", timeout.count() / 1000.0, " s");
  if (line.empty()) line = str_cat("sinfo exited with status ", r.status, " and said nothing");
  KRAB_CHECK_ARG(false,
                 "elastic.autoscale.provider slurm: the Slurm controller does not answer: ", line);
  return 0;
}

std::string slurm_wrap(const std::vector<std::string>& argv) {
  std::string out = "exec";
  for (const std::string& a : argv) {
    out += " '";
    for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += "'";
  }
  return out;
}

std::optional<std::string> parse_sbatch_id(const std::string& out) {
  std::string line = first_line(out);
  line = line.substr(0, line.find(';'));
  if (line.empty() || line.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return line;
}

std::optional<int> parse_idle_cpus(const std::string& out) {
  std::stringstream in(out);
  std::string line;
  std::optional<int> idle;
  while (std::getline(in, line)) {
    if (first_line(line).empty()) continue;
    long counts[4];
    char tail = 0;
    if (std::sscanf(line.c_str(), "%ld/%ld/%ld/%ld %c", &counts[0], &counts[1], &counts[2],
                    &counts[3], &tail) != 4 ||
        counts[1] < 0)
      return std::nullopt;
    idle = idle.value_or(0) + static_cast<int>(counts[1]);
  }
  return idle;
}

std::map<std::string, std::string> parse_squeue(const std::string& out) {
  std::map<std::string, std::string> states;
  std::stringstream in(out);
  std::string id, state;
  while (in >> id >> state) states[id] = state;
  return states;
}

SlurmProvider::SlurmProvider(SlurmOptions options) : options_(std::move(options)) {}

SlurmProvider::~SlurmProvider() { shutdown(); }

CommandResult SlurmProvider::client(const std::vector<std::string>& argv) const {
  return run_command(argv, options_.env, options_.timeout);
}

WorkerHandle SlurmProvider::add(const WorkerSpec& spec) {
  std::vector<std::string> argv = {options_.clients.sbatch,
                                   "--parsable",
                                   "--job-name=" + options_.job_name,
                                   "--ntasks=1",
                                   "--export=ALL",
                                   "--output=" + options_.run_dir + "/slurm-%j.out"};
  argv.insert(argv.end(), options_.extra.begin(), options_.extra.end());
  argv.push_back("--wrap");
  argv.push_back(slurm_wrap(spec.argv));
  // sbatch's environment is the worker's: --export=ALL is how it reaches the job.
  const CommandResult r = run_command(argv, spec.env, options_.timeout);
  const std::optional<std::string> id = r.status == 0 ? parse_sbatch_id(r.out) : std::nullopt;
  if (!id) {
    CommandResult shown_result = r;
    if (r.status == 0) shown_result.err = "an answer that is not a job id: " + first_line(r.out);
    throw Error(str_cat("cannot add member ", spec.member.str(), ": ",
                        describe_failure(shown(argv), shown_result, options_.timeout)));
  }
  WorkerHandle handle{spec.member, *id};
  jobs_[*id] = {handle, std::chrono::steady_clock::now()};
  return handle;
}

void SlurmProvider::scancel(const std::vector<std::string>& args,
                            const std::vector<std::string>& ids) const {
  std::vector<std::string> argv = {options_.clients.scancel};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), ids.begin(), ids.end());
  try {
    const CommandResult r = client(argv);
    if (r.status != 0)
      std::fprintf(stderr, "krab: %s\n",
                   describe_failure(shown(argv), r, options_.timeout).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "krab: %s\n", e.what());
  }
}

void SlurmProvider::remove(const WorkerHandle& handle) {
  scancel({"--batch", "--signal=TERM"}, {handle.id});
}

void SlurmProvider::kill(const WorkerHandle& handle) {
  scancel({"--full", "--signal=KILL"}, {handle.id});
}

int SlurmProvider::capacity() {
  const auto now = std::chrono::steady_clock::now();
  if (capacity_at_ != std::chrono::steady_clock::time_point{} &&
      now - capacity_at_ < options_.refresh)
    return capacity_;
  capacity_at_ = now;
  const std::vector<std::string> argv = {options_.clients.sinfo, "-h", "-o", "%C"};
  try {
    const CommandResult r = client(argv);
    const std::optional<int> idle = r.status == 0 ? parse_idle_cpus(r.out) : std::nullopt;
    if (idle) {
      capacity_ = *idle;
      capacity_error_.clear();
      return capacity_;
    }
    const std::string why = describe_failure(shown(argv), r, options_.timeout);
    if (why != capacity_error_)
      std::fprintf(stderr, "krab: autoscale: no Slurm capacity known: %s\n", why.c_str());
    capacity_error_ = why;
  } catch (const std::exception& e) {
    capacity_error_ = e.what();
  }
  capacity_ = 0;
  return capacity_;
}

std::optional<std::map<std::string, std::string>> SlurmProvider::states() const {
  const std::vector<std::string> argv = {options_.clients.squeue, "-h", "--states=all", "-j",
                                         joined(live_jobs()),     "-o", "%i %T"};
  try {
    const CommandResult r = client(argv);
    if (r.status == 0) return parse_squeue(r.out);
    // squeue refuses a list whose jobs are all purged ("Invalid job id specified").
    if (first_line(r.err).find("Invalid job id") != std::string::npos)
      return std::map<std::string, std::string>{};
  } catch (const std::exception&) {
  }
  return std::nullopt;  // asked again at the next poll
}

std::vector<WorkerHandle> SlurmProvider::poll() {
  const auto now = std::chrono::steady_clock::now();
  if (jobs_.empty() || now - polled_at_ < options_.refresh) return {};
  polled_at_ = now;
  const std::optional<std::map<std::string, std::string>> seen = states();
  if (!seen) return {};
  std::vector<WorkerHandle> gone;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const auto state = seen->find(it->first);
    const bool pending = state != seen->end() && state->second == "PENDING";
    if (pending && now - it->second.submitted >= options_.pending_limit) {
      std::fprintf(stderr,
                   "krab: autoscale: Slurm job %s (member %s) pending for elastic.wait_s %g s; "
                   "cancelled (no capacity)\n",
                   it->first.c_str(), it->second.handle.member.str().c_str(),
                   options_.pending_limit.count() / 1000.0);
      scancel({}, {it->first});
    } else if (state != seen->end() && active(state->second)) {
      ++it;
      continue;
    }
    gone.push_back(it->second.handle);
    it = jobs_.erase(it);
  }
  return gone;
}

std::vector<std::string> SlurmProvider::live_jobs() const {
  std::vector<std::string> ids;
  for (const auto& [id, job] : jobs_) ids.push_back(id);
  return ids;
}

void SlurmProvider::shutdown() {
  if (jobs_.empty()) return;
  // Each phase waits until squeue lists none of the jobs as active (COMPLETING included: its
  // processes are still being ended), bounded.
  auto wait_gone = [&](std::chrono::milliseconds bound) {
    const auto until = std::chrono::steady_clock::now() + bound;
    while (std::chrono::steady_clock::now() < until) {
      const auto seen = states();
      bool left = false;
      if (seen)
        for (const auto& [id, state] : *seen)
          left = left || (jobs_.count(id) && (active(state) || state == "COMPLETING"));
      if (seen && !left) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  };
  // A pending job is cancelled at once; a running worker usually ends with the run by itself
  // (the launcher saw its own workers exit first), so it is given end_grace to do so, then asked
  // to leave (SIGTERM), then killed. Only active jobs are signalled: scancel complains about
  // ended ones.
  std::vector<std::string> pending;
  if (const auto seen = states())
    for (const auto& [id, state] : *seen)
      if (jobs_.count(id) && state == "PENDING") pending.push_back(id);
  if (!pending.empty()) scancel({}, pending);
  if (wait_gone(options_.end_grace)) {
    jobs_.clear();
    return;
  }
  std::vector<std::string> live;
  if (const auto seen = states())
    for (const auto& [id, state] : *seen)
      if (jobs_.count(id) && active(state)) live.push_back(id);
  if (!live.empty()) scancel({"--batch", "--signal=TERM"}, live);
  const std::string ids = joined(live_jobs());
  if (!wait_gone(options_.end_grace)) {
    std::fprintf(stderr, "krab: Slurm job(s) %s still running %g s after SIGTERM; killing them\n",
                 ids.c_str(), options_.end_grace.count() / 1000.0);
    scancel({"--full", "--signal=KILL"}, live_jobs());
    scancel({}, live_jobs());
    if (!wait_gone(2 * options_.timeout))
      std::fprintf(stderr, "krab: Slurm job(s) %s may still be listed by squeue\n", ids.c_str());
  }
  jobs_.clear();
}

}  // namespace krab::elastic
