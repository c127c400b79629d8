#include "elastic/generation.h"

#include <limits>
#include <set>

#include "core/errors.h"
#include "core/printable.h"

namespace krab::elastic {
namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxStep = std::numeric_limits<int64_t>::max() / 2;
constexpr int64_t kMaxUnixSeconds = 1'000'000'000'000;  // year ~33000: plenty, and ms fit

// Canonical decimal: digits only, no sign, no leading zero (but "0"), at most `max`. Canonical
// so that every value has one spelling and decode(encode(r)) == r holds byte for byte.
bool parse_number(std::string_view s, int64_t max, int64_t* out) {
  if (s.empty() || s.size() > 19 || (s.size() > 1 && s[0] == '0')) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    if (v > (max - (c - '0')) / 10) return false;  // checked before it could overflow
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

std::vector<std::string_view> split_spaces(std::string_view s, size_t max_fields) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (fields.size() + 1 < max_fields) {
    const size_t space = s.find(' ', start);
    if (space == std::string_view::npos) break;
    fields.push_back(s.substr(start, space - start));
    start = space + 1;
  }
  fields.push_back(s.substr(start));
  return fields;
}

// Walks the text one line at a time. Every refusal names the line it is on, so a user looking
// at the store's bytes finds the fault at once.
class LineReader {
 public:
  explicit LineReader(std::string_view text) : text_(text) {}

  [[noreturn]] void fail(const std::string& why) const {
    if (line_.data() == nullptr)
      throw CorruptData(str_cat("generation record line ", line_no_, ": ", why));
    throw CorruptData(str_cat("generation record line ", line_no_, ": ", why, " (line '",
                              core::printable(line_, 120), "')"));
  }

  bool at_end() const { return pos_ == text_.size(); }

  // The next line's key, without consuming the line ("" at the end of the text).
  std::string_view peek_key() const {
    if (at_end()) return {};
    const auto rest = text_.substr(pos_);
    return rest.substr(0, rest.find_first_of(" \n"));
  }

  // Consumes the next line, which must be `key value` with a non-empty value; returns value.
  std::string_view expect(std::string_view key) {
    ++line_no_;
    line_ = {};
    if (at_end()) fail(str_cat("the record ends here; expected key '", key, "'"));
    const size_t newline = text_.find('\n', pos_);
    const size_t end = newline == std::string_view::npos ? text_.size() : newline;
    line_ = text_.substr(pos_, end - pos_);
    if (line_.size() > kMaxLineBytes) fail(str_cat("longer than ", kMaxLineBytes, " bytes"));
    if (newline == std::string_view::npos) fail("the last line has no '\\n'");
    pos_ = newline + 1;
    for (char c : line_) {
      const auto b = static_cast<unsigned char>(c);
      if (b < 0x20 || b == 0x7f) fail("a control byte");
    }
    const size_t space = line_.find(' ');
    const auto found = line_.substr(0, space);
    if (found != key) fail(str_cat("expected key '", key, "', found '", found, "'"));
    if (space == std::string_view::npos || space + 1 == line_.size())
      fail(str_cat("key '", key, "' has no value"));
    return line_.substr(space + 1);
  }

  // Nothing may follow the `state` line.
  void expect_end() {
    if (at_end()) return;
    ++line_no_;
    const auto rest = text_.substr(pos_);
    line_ = rest.substr(0, rest.find('\n'));
    fail("a line after 'state', which ends the record");
  }

  int64_t number(std::string_view field, int64_t max, std::string_view what) const {
    int64_t v = 0;
    if (!parse_number(field, max, &v))
      fail(str_cat(what, " is not a decimal number in [0, ", max, "]"));
    return v;
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
  size_t line_no_ = 0;
  std::string_view line_;
};

MemberId member_id_at(const LineReader& in, std::string_view text) {
  try {
    return MemberId::parse(text);
  } catch (const CorruptData& e) {
    in.fail(e.what());
  }
}

Member parse_member(const LineReader& in, std::string_view value, int rank) {
  const auto f = split_spaces(value, 6);
  if (f.size() != 5) in.fail("a member line has 5 fields: rank node local_rank pid member_id");
  Member m;
  m.rank = static_cast<int>(in.number(f[0], kMaxInt, "rank"));
  m.node = static_cast<int>(in.number(f[1], kMaxInt, "node"));
  m.local_rank = static_cast<int>(in.number(f[2], kMaxInt, "local_rank"));
  m.pid = in.number(f[3], kMaxInt, "pid");
  m.id = member_id_at(in, f[4]);
  if (m.rank != rank) in.fail(str_cat("rank ", m.rank, " where rank ", rank, " was due"));
  if (m.node != m.id.node)
    in.fail(str_cat("node ", m.node, " differs from the member id's node ", m.id.node));
  return m;
}

// `file PATH` or `HOST:PORT`.
void check_store(const LineReader& in, std::string_view store) {
  if (store.substr(0, 5) == "file ") {
    if (store.size() == 5) in.fail("store 'file' names no path");
    return;
  }
  const size_t colon = store.rfind(':');
  int64_t port = 0;
  if (colon == std::string_view::npos || colon == 0 ||
      store.substr(0, colon).find(' ') != std::string_view::npos ||
      !parse_number(store.substr(colon + 1), 65535, &port) || port == 0)
    in.fail("store is neither 'file PATH' nor 'HOST:PORT'");
}

int64_t parse_decided_at(const LineReader& in, std::string_view value) {
  const size_t dot = value.find('.');
  if (dot == std::string_view::npos || value.size() - dot != 4)
    in.fail("decided_at is Unix seconds with 3 decimals (1765000000.125)");
  const int64_t seconds = in.number(value.substr(0, dot), kMaxUnixSeconds, "decided_at");
  int64_t millis = 0;
  const auto frac = value.substr(dot + 1);
  for (char c : frac) {
    if (c < '0' || c > '9') in.fail("decided_at's decimals are not digits");
    millis = millis * 10 + (c - '0');
  }
  return seconds * 1000 + millis;
}

void parse_state(const LineReader& in, std::string_view value, GenerationRecord* r) {
  if (value == "run") {
    r->state = RecordState::kRun;
  } else if (value == "waiting") {
    r->state = RecordState::kWaiting;
  } else if (value == "stop") {
    r->state = RecordState::kStop;
  } else if (value.substr(0, 8) == "restore " && value.size() > 8) {
    r->state = RecordState::kRestore;
    r->restore_dir = std::string(value.substr(8));
  } else {
    in.fail("state is run, waiting, stop or 'restore DIR'");
  }
  if (r->state == RecordState::kRun && r->members.empty()) in.fail("state run with no members");
}

// The member lines; every id once.
void parse_members(LineReader& in, GenerationRecord* r) {
  const int64_t workers = in.number(in.expect("workers"), kMaxMembers, "workers");
  std::set<MemberId> ids;
  r->members.reserve(static_cast<size_t>(workers));
  for (int rank = 0; rank < workers; ++rank) {
    r->members.push_back(parse_member(in, in.expect("member"), rank));
    if (!ids.insert(r->members.back().id).second)
      in.fail(str_cat("member id ", r->members.back().id.str(), " appears twice"));
  }
}

// The lost lines: ids of the previous generation, none of them a member of this one.
void parse_lost(LineReader& in, GenerationRecord* r) {
  std::set<MemberId> ids;
  for (const auto& m : r->members) ids.insert(m.id);
  while (in.peek_key() == "lost") {
    if (r->lost.size() >= static_cast<size_t>(kMaxMembers))
      in.fail(str_cat("more than ", kMaxMembers, " lost members"));
    const auto f = split_spaces(in.expect("lost"), 2);
    if (f.size() != 2 || f[1].empty()) in.fail("a lost line is 'lost MEMBER_ID CAUSE'");
    const MemberId id = member_id_at(in, f[0]);
    if (!ids.insert(id).second)
      in.fail(str_cat("member id ", id.str(), " is lost twice, or lost and a member"));
    r->lost.push_back({id, std::string(f[1])});
  }
}

}  // namespace

MemberId MemberId::parse(std::string_view text) {
  MemberId id;
  int64_t v[3] = {0, 0, 0};
  size_t start = 0;
  bool ok = text.size() <= 32;
  for (int i = 0; ok && i < 3; ++i) {
    const size_t dot = i < 2 ? text.find('.', start) : text.size();
    ok = dot != std::string_view::npos &&
         parse_number(text.substr(start, dot - start), kMaxInt, &v[i]);
    start = dot + 1;
  }
  if (!ok)
    throw CorruptData(
        str_cat("member id '", core::printable(text, 40), "' is not <node>.<slot>.<incarnation>"));
  id.node = static_cast<int>(v[0]);
  id.slot = static_cast<int>(v[1]);
  id.incarnation = static_cast<int>(v[2]);
  return id;
}

std::string MemberId::str() const { return str_cat(node, '.', slot, '.', incarnation); }

std::string_view kind_name(RecordKind kind) {
  return kind == RecordKind::kAbort ? "abort" : "proposal";
}

std::string_view state_name(RecordState state) {
  switch (state) {
    case RecordState::kRun:
      return "run";
    case RecordState::kWaiting:
      return "waiting";
    case RecordState::kStop:
      return "stop";
    case RecordState::kRestore:
      return "restore";
  }
  return "?";
}

std::string encode(const GenerationRecord& r) {
  std::string out = str_cat("generation ", r.generation, "\ndecided_step ", r.decided_step,
                            "\nworkers ", r.members.size(), "\n");
  for (const auto& m : r.members)
    out += str_cat("member ", m.rank, ' ', m.node, ' ', m.local_rank, ' ', m.pid, ' ', m.id.str(),
                   '\n');
  out += str_cat("store ", r.store, "\nkind ", kind_name(r.kind), "\nreason ", r.reason, '\n');
  for (const auto& l : r.lost) out += str_cat("lost ", l.id.str(), ' ', l.cause, '\n');
  const int64_t ms = r.decided_at_ms < 0 ? -1 : r.decided_at_ms % 1000;
  out += str_cat("decided_at ", r.decided_at_ms / 1000, '.', ms < 100 ? "0" : "",
                 ms < 10 ? "0" : "", ms, "\nstate ", state_name(r.state));
  if (r.state == RecordState::kRestore) out += str_cat(' ', r.restore_dir);
  out += '\n';
  // Whatever is written must read back as itself: check it here, where a bad record is the
  // writer's bug, rather than in every reader, where it would look like a corrupt store.
  try {
    if (decode(out) == r) return out;
  } catch (const CorruptData& e) {
    throw InvalidArgument(str_cat("generation ", r.generation, " cannot be encoded: ", e.what()));
  }
  throw InvalidArgument(
      str_cat("generation ", r.generation, " cannot be encoded: it does not read back as itself"));
}

GenerationRecord decode(std::string_view text) {
  if (text.size() > kMaxRecordBytes)
    throw CorruptData(str_cat("generation record of ", text.size(), " bytes exceeds the bound of ",
                              kMaxRecordBytes));
  LineReader in(text);
  GenerationRecord r;
  r.generation = in.number(in.expect("generation"), kMaxStep, "generation");
  r.decided_step = in.number(in.expect("decided_step"), kMaxStep, "decided_step");
  parse_members(in, &r);
  r.store = std::string(in.expect("store"));
  check_store(in, r.store);
  const auto kind = in.expect("kind");
  if (kind != "abort" && kind != "proposal") in.fail("kind is abort or proposal");
  r.kind = kind == "abort" ? RecordKind::kAbort : RecordKind::kProposal;
  r.reason = std::string(in.expect("reason"));
  parse_lost(in, &r);
  r.decided_at_ms = parse_decided_at(in, in.expect("decided_at"));
  parse_state(in, in.expect("state"), &r);
  in.expect_end();
  return r;
}

}  // namespace krab::elastic
