// GenerationRecord: one membership of an elastic run, as the keeper decided it
// (docs/design/elastic.md §1.1).
//
// A generation g is a fixed list of members (rank → process) and the store its group is built
// in. The keeper (elastic/keeper.h) decides each one; an adapter writes it, encoded, under
// `elastic/gen/<g>` with a compare-and-set from absent, and sets `elastic/current` to g. Every
// worker's MembershipView reads it back with decode(). A record is never changed once written:
// any change of membership is the next generation. That once-only rule is the keeper's and the
// store's, not this module's: here is only the record and its text form.
//
// The text form, one `key value` per line, each line ending in '\n', keys in this order:
//
//   generation 3
//   decided_step 41               newest step the keeper saw completed (informational, §2.2)
//   workers 3                     the number of `member` lines that follow
//   member 0 0 0 4121 0.0.0       rank node local_rank pid member_id, ranks 0..workers-1 in order
//   member 1 0 2 4123 0.2.0
//   member 2 1 0 977 1.0.1
//   store file /run/dir/g3.store  `file PATH` (one machine) or `HOST:PORT` (a TCPStore)
//   kind abort                    abort: g-1 is broken, abort its group now; proposal: finish
//                                 the current step, switch after its commit vote
//   reason death                  short words, comma-separated (death, freeze, suspect,
//                                 group error, lease, leave, join, start, stop)
//   lost 0.1.0 killed by signal 9 zero or more: a member id of g-1 and why it is gone
//   decided_at 1765000000.125     Unix seconds, millisecond resolution
//   state run                     run | waiting | stop | restore DIR (§2.5, §4.4)
//
// decode() reads text that arrived through a store, which anyone holding the job secret can
// write: it is untrusted. It refuses, with CorruptData naming the line number and quoting the
// line (escaped: core/printable.h), anything but the form above: more than kMaxRecordBytes,
// an unknown, repeated, missing or misplaced key, a number that is not canonical decimal or
// overflows, a rank out of order, a member id that repeats, a control byte, a line without
// its '\n'. encode() of a record that decode() would refuse throws InvalidArgument (a bug of
// the caller), so whatever is written can be read back: decode(encode(r)) == r.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace krab::elastic {

// `<node>.<slot>.<incarnation>`: a worker process of the run. `slot` is the launcher's local
// worker slot on `node`; a replacement in the same slot is a new incarnation, hence a new
// member — an id is never reused within a run (§1.1).
struct MemberId {
  int node = 0;
  int slot = 0;
  int incarnation = 0;

  // Parses the canonical form: three decimal numbers in [0, 2^31) without sign or leading
  // zeros, separated by '.'. Throws CorruptData naming (escaped) `text` otherwise.
  static MemberId parse(std::string_view text);
  std::string str() const;

  friend bool operator==(const MemberId& a, const MemberId& b) {
    return a.node == b.node && a.slot == b.slot && a.incarnation == b.incarnation;
  }
  friend bool operator!=(const MemberId& a, const MemberId& b) { return !(a == b); }
  friend bool operator<(const MemberId& a, const MemberId& b) {
    if (a.node != b.node) return a.node < b.node;
    if (a.slot != b.slot) return a.slot < b.slot;
    return a.incarnation < b.incarnation;
  }
};

// One rank of a generation. `node` equals `id.node`; `local_rank` is the worker's index among
// this generation's members on its node (the adapter's choice; it picks devices and threads);
// `pid` is the process id on its node, 0 when the keeper does not know it.
struct Member {
  int rank = 0;
  int node = 0;
  int local_rank = 0;
  int64_t pid = 0;
  MemberId id;

  friend bool operator==(const Member& a, const Member& b) {
    return a.rank == b.rank && a.node == b.node && a.local_rank == b.local_rank && a.pid == b.pid &&
           a.id == b.id;
  }
};

// A member of the previous generation that is not in this one, and why ("killed by signal 9",
// "exited with status 1", "no heartbeat for 3000 ms", "left").
struct LostMember {
  MemberId id;
  std::string cause;

  friend bool operator==(const LostMember& a, const LostMember& b) {
    return a.id == b.id && a.cause == b.cause;
  }
};

enum class RecordKind { kAbort, kProposal };

// What the members of the generation do (§2.5, §4.4): train; wait in recover() for joiners
// (fewer than elastic.min_workers); write a checkpoint of the committed step and exit 1; or
// restore from the checkpoint `restore_dir` (two adjacent ZeRO ranks died together).
enum class RecordState { kRun, kWaiting, kStop, kRestore };

struct GenerationRecord {
  int64_t generation = 0;
  int64_t decided_step = 0;
  std::vector<Member> members;  // members[r].rank == r
  std::string store;            // "file PATH" or "HOST:PORT"
  RecordKind kind = RecordKind::kProposal;
  std::string reason;
  std::vector<LostMember> lost;
  int64_t decided_at_ms = 0;  // Unix time in milliseconds; the text says seconds
  RecordState state = RecordState::kRun;
  std::string restore_dir;  // only with RecordState::kRestore

  int workers() const { return static_cast<int>(members.size()); }

  friend bool operator==(const GenerationRecord& a, const GenerationRecord& b) {
    return a.generation == b.generation && a.decided_step == b.decided_step &&
           a.members == b.members && a.store == b.store && a.kind == b.kind &&
           a.reason == b.reason && a.lost == b.lost && a.decided_at_ms == b.decided_at_ms &&
           a.state == b.state && a.restore_dir == b.restore_dir;
  }
};

// Bounds decode() enforces (and encode() respects): a record is small, and a store value that
// claims to be one must not make a reader allocate without limit.
inline constexpr size_t kMaxRecordBytes = 1 << 20;
inline constexpr int kMaxMembers = 16384;
inline constexpr size_t kMaxLineBytes = 4096;

// "abort" / "proposal"; "run" / "waiting" / "stop" / "restore" (without the directory).
std::string_view kind_name(RecordKind kind);
std::string_view state_name(RecordState state);

// The text form above. Throws InvalidArgument when `record` breaks a rule decode() checks.
std::string encode(const GenerationRecord& record);

// Parses the text form. Throws CorruptData ("generation record line 5: ...") on anything else.
GenerationRecord decode(std::string_view text);

}  // namespace krab::elastic
