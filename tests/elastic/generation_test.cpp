// Generation records (elastic/generation.h): the text form written literally, round trips of
// representative records, and every malformed input refused by name — with the line it is on.
#include "elastic/generation.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/errors.h"

namespace krab::elastic {
namespace {

GenerationRecord sample() {
  GenerationRecord r;
  r.generation = 3;
  r.decided_step = 41;
  r.members = {{0, 0, 0, 4121, {0, 0, 0}}, {1, 0, 2, 4123, {0, 2, 0}}, {2, 1, 0, 977, {1, 0, 1}}};
  r.store = "file /tmp/run/g3.store";
  r.kind = RecordKind::kAbort;
  r.reason = "death, join";
  r.lost = {{{0, 1, 0}, "killed by signal 9"}};
  r.decided_at_ms = 1765000000125;
  r.state = RecordState::kRun;
  return r;
}

// The text of sample(), written out by hand: the independent expectation of encode().
const char* const kSampleText =
    "generation 3\n"                   // 1
    "decided_step 41\n"                // 2
    "workers 3\n"                      // 3
    "member 0 0 0 4121 0.0.0\n"        // 4
    "member 1 0 2 4123 0.2.0\n"        // 5
    "member 2 1 0 977 1.0.1\n"         // 6
    "store file /tmp/run/g3.store\n"   // 7
    "kind abort\n"                     // 8
    "reason death, join\n"             // 9
    "lost 0.1.0 killed by signal 9\n"  // 10
    "decided_at 1765000000.125\n"      // 11
    "state run\n";                     // 12

// Replaces the first occurrence of `from` in the sample text.
std::string sample_with(const std::string& from, const std::string& to) {
  std::string text = kSampleText;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

// decode(text) must throw CorruptData whose message starts with `prefix` and contains `what`.
void expect_refused(const std::string& text, const std::string& prefix, const std::string& what) {
  try {
    decode(text);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const CorruptData& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(Generation, EncodesTheDocumentedText) {
  EXPECT_EQ(encode(sample()), kSampleText);
  EXPECT_EQ(decode(kSampleText), sample());
}

TEST(Generation, RepresentativeRecordsRoundTrip) {
  std::vector<GenerationRecord> records;
  GenerationRecord start;  // generation 0 as the launcher writes it
  start.members = {{0, 0, 0, 10, {0, 0, 0}}, {1, 0, 1, 11, {0, 1, 0}}};
  start.store = "file /r/g0.store";
  start.reason = "start";
  records.push_back(start);
  records.push_back(sample());
  GenerationRecord waiting = sample();  // everyone lost, across machines
  waiting.members.clear();
  waiting.store = "10.0.0.7:29400";
  waiting.lost = {{{0, 0, 0}, "lease of node 0 expired"}, {{7, 3, 12}, "left"}};
  waiting.state = RecordState::kWaiting;
  waiting.decided_at_ms = 7;  // 0.007 s: leading zeros of the decimals
  records.push_back(waiting);
  GenerationRecord stop = sample();
  stop.kind = RecordKind::kProposal;
  stop.state = RecordState::kStop;
  stop.store = "[::1]:65535";
  stop.generation = (int64_t{1} << 62) - 1;  // the largest a reader accepts
  stop.decided_step = stop.generation;
  records.push_back(stop);
  GenerationRecord restore = sample();
  restore.state = RecordState::kRestore;
  restore.restore_dir = "/runs/a b/step-00000040";  // spaces survive
  restore.members[1].pid = 0;                       // pid unknown to the keeper
  restore.members[2].id = {1, 2147483647, 2147483647};
  records.push_back(restore);
  for (const auto& r : records) {
    const std::string text = encode(r);
    EXPECT_EQ(decode(text), r) << text;
    EXPECT_EQ(encode(decode(text)), text);
  }
}

TEST(Generation, MemberIdsParseOnlyTheCanonicalForm) {
  for (const char* good : {"0.0.0", "3.1.2", "2147483647.2147483647.2147483647", "10.0.100"})
    EXPECT_EQ(MemberId::parse(good).str(), good);
  EXPECT_EQ(MemberId::parse("4.5.6"), (MemberId{4, 5, 6}));
  for (const char* bad :
       {"", "1.2", "1.2.3.4", "01.2.3", "1.02.3", "-1.2.3", "+1.2.3", "1.2.x", "1..3", ".1.2",
        "1.2.", "2147483648.0.0", " 1.2.3", "1.2.3 ", "1 .2.3", "1.2.3\n", "0x1.2.3"}) {
    try {
      MemberId::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find("is not <node>.<slot>.<incarnation>"),
                std::string::npos);
    }
  }
}

TEST(Generation, RefusesEveryMalformedLineByNumber) {
  struct Case {
    std::string text;
    int line;
    std::string what;
  };
  const std::vector<Case> cases = {
      {"", 1, "the record ends here; expected key 'generation'"},
      {sample_with("state run\n", "state run"), 12, "the last line has no '\\n'"},
      {sample_with("decided_step", "colour"), 2, "expected key 'decided_step', found 'colour'"},
      {sample_with("decided_step 41\n", "generation 3\ndecided_step 41\n"), 2,
       "expected key 'decided_step', found 'generation'"},
      {sample_with("store file /tmp/run/g3.store\n", ""), 7, "expected key 'store', found 'kind'"},
      {sample_with("generation 3", "generation 03"), 1, "generation is not a decimal number"},
      {sample_with("generation 3", "generation -3"), 1, "generation is not a decimal number"},
      {sample_with("generation 3", "generation +3"), 1, "generation is not a decimal number"},
      {sample_with("generation 3", "generation 99999999999999999999"), 1, "not a decimal"},
      {sample_with("generation 3", "generation 9999999999999999999"), 1, "not a decimal"},
      {sample_with("generation 3", "generation 4611686018427387904"), 1, "not a decimal"},
      {sample_with("decided_step 41", "decided_step 18446744073709551657"), 2, "not a decimal"},
      {sample_with("decided_step 41", "decided_step 4 1"), 2, "decided_step is not a decimal"},
      {sample_with("workers 3", "workers 16385"), 3,
       "workers is not a decimal number in [0, 16384]"},
      {sample_with("workers 3", "workers 4"), 7, "expected key 'member', found 'store'"},
      {sample_with("workers 3", "workers 2"), 6, "expected key 'store', found 'member'"},
      {sample_with("member 0 0 0", "member 1 0 0"), 4, "rank 1 where rank 0 was due"},
      {sample_with("member 2 1 0 977 1.0.1", "member 2 0 0 977 0.0.0"), 6,
       "member id 0.0.0 appears twice"},
      {sample_with("member 2 1 0 977 1.0.1", "member 2 0 0 977 1.0.1"), 6,
       "node 0 differs from the member id's node 1"},
      {sample_with("member 1 0 2 4123 0.2.0", "member 1 0 2 0.2.0"), 5, "5 fields"},
      {sample_with("member 1 0 2 4123 0.2.0", "member 1 0 2 4123 0.2.0 x"), 5, "5 fields"},
      {sample_with("member 1 0 2 4123 0.2.0", "member 1 0 2  0.2.0"), 5, "pid is not a decimal"},
      {sample_with("4123", "2147483648"), 5, "pid is not a decimal number"},
      {sample_with("0.2.0", "0.2"), 5, "member id '0.2' is not"},
      {sample_with("store file /tmp/run/g3.store", "store nowhere"), 7, "neither 'file PATH'"},
      {sample_with("store file /tmp/run/g3.store", "store host:0"), 7, "'HOST:PORT'"},
      {sample_with("store file /tmp/run/g3.store", "store host:65536"), 7, "'HOST:PORT'"},
      {sample_with("store file /tmp/run/g3.store", "store :80"), 7, "'HOST:PORT'"},
      {sample_with("store file /tmp/run/g3.store", "store file"), 7, "neither 'file PATH'"},
      {sample_with("kind abort", "kind maybe"), 8, "kind is abort or proposal"},
      {sample_with("reason death, join", "reason "), 9, "key 'reason' has no value"},
      {sample_with("reason death, join", "reason"), 9, "key 'reason' has no value"},
      {sample_with("lost 0.1.0 killed by signal 9", "lost 0.1.0"), 10, "'lost MEMBER_ID CAUSE'"},
      {sample_with("lost 0.1.0 killed", "lost 0.2.0 killed"), 10, "lost and a member"},
      {sample_with("lost 0.1.0 killed by signal 9\n", "lost 5.0.0 x\nlost 5.0.0 y\n"), 11,
       "member id 5.0.0 is lost twice"},
      {sample_with("decided_at 1765000000.125", "decided_at 1765000000"), 11, "3 decimals"},
      {sample_with("decided_at 1765000000.125", "decided_at 1765000000.12"), 11, "3 decimals"},
      {sample_with("decided_at 1765000000.125", "decided_at 1765000000.1x5"), 11, "not digits"},
      {sample_with("decided_at 1765000000.125", "decided_at -1.125"), 11, "decided_at is not"},
      {sample_with("state run", "state running"), 12, "state is run, waiting, stop"},
      {sample_with("state run", "state restore"), 12, "state is run, waiting, stop"},
      {sample_with("state run\n", "state run\nextra 1\n"), 13, "a line after 'state'"},
      {sample_with("state run\n", "state run\n\n"), 13, "a line after 'state'"},
      {sample_with("reason death", "reason de\x1b[2Jath"), 9, "a control byte"},
      {sample_with("kind abort\n", "kind abort\r\n"), 8, "a control byte"},
      {sample_with("reason death", std::string("reason de\0ath", 13)), 9, "a control byte"},
      {sample_with("reason death", "reason " + std::string(5000, 'x')), 9, "longer than 4096"},
  };
  for (const auto& c : cases)
    expect_refused(c.text, "generation record line " + std::to_string(c.line) + ": ", c.what);

  GenerationRecord empty_run = sample();
  empty_run.members.clear();
  std::string text = encode([&] {
    auto w = empty_run;
    w.state = RecordState::kWaiting;
    return w;
  }());
  expect_refused(text.replace(text.find("state waiting"), 13, "state run"),
                 "generation record line 9: ", "state run with no members");
}

TEST(Generation, QuotesRefusedBytesEscaped) {
  // The message quotes the line with control bytes written as escapes, never raw.
  try {
    decode(sample_with("kind abort", "kind \x1b[31mred"));
    FAIL();
  } catch (const CorruptData& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("\\x1b[31mred"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\x1b'), std::string::npos);
  }
}

TEST(Generation, RefusesOversizedInputBeforeReadingIt) {
  std::string huge(kMaxRecordBytes + 1, 'x');
  expect_refused(huge, "generation record of 1048577 bytes exceeds the bound of 1048576", "");
  // A record just within the bound is read (many lost lines, each short).
  GenerationRecord r = sample();
  for (int i = 0; i + 1 < kMaxMembers; ++i) r.lost.push_back({{100, i, 0}, "left"});
  EXPECT_LE(encode(r).size(), kMaxRecordBytes);
  EXPECT_EQ(decode(encode(r)).lost.size(), static_cast<size_t>(kMaxMembers));
  r.lost.push_back({{101, 0, 0}, "left"});  // one more than any record has
  EXPECT_THROW(encode(r), InvalidArgument);
}

// Exhaustive over the sample: every proper prefix is refused (a record cut short by a torn
// write is never taken for a shorter one), and a control byte put at any position is refused
// naming the line that position is on.
TEST(Generation, EveryPrefixAndEveryPoisonedByteIsRefused) {
  const std::string text = kSampleText;
  for (size_t n = 0; n < text.size(); ++n)
    EXPECT_THROW(decode(text.substr(0, n)), CorruptData) << "prefix of " << n << " bytes";
  int line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    std::string poisoned = text;
    poisoned[i] = '\x01';
    // Poisoning a '\n' joins two lines: the joined line is still the one `line` counts.
    expect_refused(poisoned, "generation record line " + std::to_string(line) + ": ", "");
    if (text[i] == '\n') ++line;
  }
}

TEST(Generation, EncodeRefusesARecordThatWouldNotReadBack) {
  GenerationRecord r = sample();
  r.reason = "death\nstate stop";  // would forge a line
  EXPECT_THROW(encode(r), InvalidArgument);
  r = sample();
  r.restore_dir = "/x";  // only with state restore
  EXPECT_THROW(encode(r), InvalidArgument);
  r = sample();
  r.members[1].rank = 5;
  EXPECT_THROW(encode(r), InvalidArgument);
  r = sample();
  r.reason.clear();
  EXPECT_THROW(encode(r), InvalidArgument);
  r = sample();
  r.decided_at_ms = -5;
  EXPECT_THROW(encode(r), InvalidArgument);
}

}  // namespace
}  // namespace krab::elastic
