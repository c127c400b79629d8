// What the launchers of other machines tell the keeper through the job's store, and what it
// answers (docs/design/elastic.md §6.1-§6.4, the c10d rendezvous: node 0's launcher keeps the
// membership, the others are its agents).
//
// On one machine the keeper sees every worker's exit through waitpid and knows every joiner
// it spawned. A worker on another machine is another launcher's child, so that launcher
// (an agent) writes what the keeper would otherwise miss:
//
//   elastic/exit/<member>     "<code> <signal>" when its worker exited (status 0 included: a
//                             worker that finished is not a death, and its beats stop);
//   elastic/announce/next     a counter; elastic/announce/<k> = "<member> <local slot>": a
//                             joiner it started (a replacement, a rejoin after a partition,
//                             or a joining node's worker), which then asks as every joiner
//                             does (elastic/join/<member>, membership_view.h);
//   elastic/admit/next        a counter; elastic/admit/<k> = the joining node's job
//                             fingerprint (cli/job_agreement.h, encoded); the keeper writes
//                             elastic/admit/<k>/answer = "node <n>" (the node number it gives
//                             the machine) or "refused <why>".
//
// A store cannot list its keys, hence the counters: the keeper reads entries from a cursor.
// All of it lives under the job secret's prefix (comm/store.h): a launcher without the secret
// finds no job at all and can write nothing the keeper reads. Everything read here is another
// machine's bytes: parses are bounded and a malformed entry is skipped (the keeper) or refused
// (the agent), never trusted.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/store.h"
#include "elastic/generation.h"

namespace krab::elastic {

// An agent's report of its worker's exit; the keeper reads it for each current member.
void report_exit(c10d::Store& store, const MemberId& member, int code, int signal);
struct ReportedExit {
  int code = 0;
  int signal = 0;
};
std::optional<ReportedExit> read_exit(c10d::Store& store, const MemberId& member);

// A joiner another launcher started (it asks to join by itself, once ready).
struct Announcement {
  MemberId member;
  int local_rank = 0;
};
void announce_joiner(c10d::Store& store, const Announcement& joiner);
// The announcements from `*cursor` on; advances it past every entry read (a malformed one is
// skipped). Non-blocking: an entry whose counter moved but whose value is not written yet is
// read at the next call.
std::vector<Announcement> read_announcements(c10d::Store& store, int64_t* cursor);

// A machine that asks to join (`krab train JOB --join HOST:PORT`): its fingerprint, the
// keeper's verdict.
struct AdmissionRequest {
  int64_t index = 0;
  std::string fingerprint;  // cli::encode(Fingerprint)
};
std::vector<AdmissionRequest> read_admissions(c10d::Store& store, int64_t* cursor);
// `node` >= 0: admitted as that node number; else refused with `why`.
void answer_admission(c10d::Store& store, int64_t index, int node, const std::string& why);
// The joining launcher's side: publishes `fingerprint`, waits up to `timeout` for the answer.
// Returns the node number; a refusal throws InvalidArgument with the keeper's words; no answer
// throws Timeout.
int ask_admission(c10d::Store& store, const std::string& fingerprint,
                  std::chrono::milliseconds timeout);

}  // namespace krab::elastic
