#include "elastic/node_requests.h"

#include <charconv>
#include <thread>

#include "core/errors.h"
#include "core/printable.h"

namespace krab::elastic {
namespace {

constexpr const char* kExitPrefix = "elastic/exit/";
constexpr const char* kAnnounceCounter = "elastic/announce/next";
constexpr const char* kAnnouncePrefix = "elastic/announce/";
constexpr const char* kAdmitCounter = "elastic/admit/next";
constexpr const char* kAdmitPrefix = "elastic/admit/";
// A fingerprint is a few KiB (one line per job key); an entry far larger is not one.
constexpr size_t kMaxEntry = 1 << 20;

std::optional<std::string> read_if_present(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  const std::vector<uint8_t> v = store.get(key);
  return std::string(v.begin(), v.end());
}

void put(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

// "<int> <int>" exactly, each within int.
bool parse_two(const std::string& text, int* a, int* b) {
  const char* p = text.data();
  const char* end = p + text.size();
  auto r = std::from_chars(p, end, *a);
  if (r.ec != std::errc() || r.ptr == end || *r.ptr != ' ') return false;
  r = std::from_chars(r.ptr + 1, end, *b);
  return r.ec == std::errc() && r.ptr == end;
}

// How many entries the counter `key` has handed out (0 when it was never used).
int64_t entries(c10d::Store& store, const std::string& key) {
  return store.check({key}) ? store.add(key, 0) : 0;
}

}  // namespace

void report_exit(c10d::Store& store, const MemberId& member, int code, int signal) {
  put(store, kExitPrefix + member.str(), str_cat(code, " ", signal));
}

std::optional<ReportedExit> read_exit(c10d::Store& store, const MemberId& member) {
  const std::optional<std::string> text = read_if_present(store, kExitPrefix + member.str());
  ReportedExit e;
  if (!text || text->size() > 32 || !parse_two(*text, &e.code, &e.signal)) return std::nullopt;
  return e;
}

void announce_joiner(c10d::Store& store, const Announcement& joiner) {
  const int64_t k = store.add(kAnnounceCounter, 1) - 1;
  put(store, str_cat(kAnnouncePrefix, k), str_cat(joiner.member.str(), " ", joiner.local_rank));
}

std::vector<Announcement> read_announcements(c10d::Store& store, int64_t* cursor) {
  std::vector<Announcement> out;
  const int64_t n = entries(store, kAnnounceCounter);
  for (; *cursor < n; ++*cursor) {
    const std::optional<std::string> text =
        read_if_present(store, str_cat(kAnnouncePrefix, *cursor));
    if (!text) break;  // counted, not written yet: read it next time
    const size_t space = text->find(' ');
    if (text->size() > 64 || space == std::string::npos) continue;
    try {
      Announcement a{MemberId::parse(std::string_view(*text).substr(0, space)), 0};
      const char* last = text->data() + text->size();
      const auto [end, ec] = std::from_chars(text->data() + space + 1, last, a.local_rank);
      if (ec == std::errc() && end == last && a.local_rank >= 0) out.push_back(a);
    } catch (const CorruptData&) {  // not a member id: skipped
    }
  }
  return out;
}

std::vector<AdmissionRequest> read_admissions(c10d::Store& store, int64_t* cursor) {
  std::vector<AdmissionRequest> out;
  const int64_t n = entries(store, kAdmitCounter);
  for (; *cursor < n; ++*cursor) {
    std::optional<std::string> text = read_if_present(store, str_cat(kAdmitPrefix, *cursor));
    if (!text) break;
    if (text->size() > kMaxEntry) {
      answer_admission(store, *cursor, -1, "the job fingerprint sent is larger than any job's");
      continue;
    }
    out.push_back({*cursor, std::move(*text)});
  }
  return out;
}

void answer_admission(c10d::Store& store, int64_t index, int node, const std::string& why) {
  put(store, str_cat(kAdmitPrefix, index, "/answer"),
      node >= 0 ? str_cat("node ", node) : "refused " + why);
}

int ask_admission(c10d::Store& store, const std::string& fingerprint,
                  std::chrono::milliseconds timeout) {
  const int64_t k = store.add(kAdmitCounter, 1) - 1;
  put(store, str_cat(kAdmitPrefix, k), fingerprint);
  const std::string key = str_cat(kAdmitPrefix, k, "/answer");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!store.check({key})) {
    if (std::chrono::steady_clock::now() > deadline)
      throw Timeout(str_cat("the running job's launcher did not answer the request to join within ",
                            timeout.count() / 1000.0, " s (comm.timeout_s)"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::vector<uint8_t> v = store.get(key);
  const std::string answer(v.begin(), v.end());
  if (answer.rfind("refused ", 0) == 0)
    throw InvalidArgument(core::printable_text(answer.substr(8)));
  int node = -1;
  const char* last = answer.data() + answer.size();
  if (answer.rfind("node ", 0) == 0) {
    const auto [end, ec] = std::from_chars(answer.data() + 5, last, node);
    if (ec == std::errc() && end == last && node > 0) return node;
  }
  throw CorruptData(str_cat("the running job answered the request to join with '",
                            core::printable_text(answer.substr(0, 64)), "'"));
}

}  // namespace krab::elastic
