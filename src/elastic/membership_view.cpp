#include "elastic/membership_view.h"

#include <charconv>
#include <chrono>
#include <cstdio>

#include "core/errors.h"

namespace krab::elastic {

namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// elastic/current holds a decimal generation; anything else is a corrupt store.
int64_t parse_generation(const std::string& text) {
  int64_t g = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), g);
  if (ec != std::errc() || end != text.data() + text.size() || g < 0)
    throw CorruptData(
        str_cat(kCurrentKey, " holds '", text.substr(0, 32), "', not a generation number"));
  return g;
}

}  // namespace

std::string record_key(int64_t generation) { return str_cat("elastic/gen/", generation); }

void publish_record(c10d::Store& store, const GenerationRecord& record) {
  const std::string key = record_key(record.generation);
  const std::vector<uint8_t> mine = bytes_of(encode(record));
  // From absent only: compareSet returns the value the key holds afterwards.
  const std::vector<uint8_t> held = store.compareSet(key, {}, mine);
  KRAB_CHECK_ARG(held == mine, "generation ", record.generation,
                 " is already recorded with other contents: a record is never rewritten");
  if (current_generation(store) < record.generation)
    store.set(kCurrentKey, bytes_of(std::to_string(record.generation)));
}

int64_t current_generation(c10d::Store& store) {
  if (!store.check({kCurrentKey})) return -1;
  return parse_generation(text_of(store.get(kCurrentKey)));
}

void publish_progress(c10d::Store& store, int64_t steps) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char text[64];
  std::snprintf(text, sizeof(text), "%lld %.6f", static_cast<long long>(steps), now);
  store.set(kProgressKey, bytes_of(text));
}

void request_join(c10d::Store& store, const MemberId& member, int64_t pid) {
  store.set(kJoinPrefix + member.str(), bytes_of(std::to_string(pid)));
}

void request_leave(c10d::Store& store, const MemberId& member) {
  store.set(kLeavePrefix + member.str(), bytes_of("1"));
}

GenerationRecord read_record(c10d::Store& store, int64_t generation) {
  const std::string key = record_key(generation);
  try {
    return decode(text_of(store.get(key)));
  } catch (const CorruptData& e) {
    throw CorruptData(str_cat(key, ": ", e.what()));
  }
}

MembershipView::MembershipView(comm::StorePtr store, int64_t running,
                               std::chrono::milliseconds period, OnAbort on_abort)
    : store_(std::move(store)),
      period_(period),
      on_abort_(std::move(on_abort)),
      newest_(running),
      running_(running),
      thread_([this] { run(); }) {}

MembershipView::~MembershipView() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void MembershipView::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    try {
      poll();
      lock.lock();
      store_error_.clear();
    } catch (const CorruptData&) {
      lock.lock();
      error_ = std::current_exception();
      changed_.notify_all();
      return;  // a record no keeper wrote: wait_for reports it
    } catch (const std::exception& e) {
      // The store did not answer (across machines: a link cut for a while, §6.4). The keeper
      // goes on deciding meanwhile; the records are read once the store answers again, and
      // wait_for's own bound decides how long that may take.
      lock.lock();
      store_error_ = e.what();
    } catch (...) {
      lock.lock();
      error_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    changed_.wait_for(lock, period_, [this] { return stop_; });
  }
}

// Reads every record newer than the newest seen, in order, so that an abort is never skipped
// by a proposal published right after it.
void MembershipView::poll() {
  const int64_t current = current_generation(*store_);
  for (int64_t g = newest_.load() + 1; g <= current; ++g) {
    GenerationRecord record = read_record(*store_, g);
    const bool abort = record.kind == RecordKind::kAbort && g > running_;
    if (abort) on_abort_(record);
    {
      std::lock_guard<std::mutex> lock(mu_);
      records_.emplace(g, std::move(record));
      newest_.store(g);
    }
    changed_.notify_all();
  }
}

GenerationRecord MembershipView::wait_for(int64_t generation, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = changed_.wait_for(
      lock, timeout, [&] { return error_ != nullptr || records_.count(generation) > 0; });
  if (error_) std::rethrow_exception(error_);
  if (!ready)
    throw Timeout(str_cat(
        "no record of generation ", generation, " after ", timeout.count(),
        " ms (newest seen: ", newest_.load(), ")",
        store_error_.empty() ? "" : "; the store's last error: ", store_error_.substr(0, 200)));
  return records_.at(generation);
}

}  // namespace krab::elastic
