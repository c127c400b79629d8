// The federated server's state file and the transport's payloads given bytes krab did not
// write: regression tests for what tests/fuzz/ found (docs/fuzzing.md). Every refusal is a krab
// error naming the file or peer, and leaves the receiver as it was.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "core/errors.h"
#include "core/record.h"
#include "federated/server_state.h"
#include "federated/transport_payload.h"

namespace krab::federated {
namespace {

namespace fs = std::filesystem;

// fl-state.krab around `payload` with a valid header (magic, length, CRC-32).
std::string state_file(const std::string& payload, const char* magic = "KRABFLS2") {
  std::string out(magic, 8);
  const uint64_t length = payload.size();
  const uint32_t crc = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  out.append(reinterpret_cast<const char*>(&length), 8);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return out + payload;
}

// A payload like save_server_state's, with `history` and the strategy's `rounds` as given.
std::string payload(const std::string& history, const at::Tensor& rounds,
                    const at::Tensor& global = torch::zeros({2})) {
  core::RecordWriter a;
  a.add_tensor("global_model", global);
  a.add_int("rounds_done", 1);
  a.add_string("history", history);
  a.add_string("signature", "sig");
  a.add_tensor("strategy.rounds", rounds);
  return a.bytes();
}
const at::Tensor kOne = torch::tensor(int64_t{1}, torch::kLong);

struct StateFile {
  std::string path =
      (fs::temp_directory_path() / ("krab-fl-state-test-" + std::to_string(::getpid()))).string();
  ~StateFile() { fs::remove(path); }
  void write(const std::string& bytes) const {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
};

RoundRunner fresh_runner() {
  FederatedOptions o;
  o.fraction = 1.0;
  o.min_clients = 1;
  o.strategy = "fedadam";
  return RoundRunner(o, torch::zeros({2}), false);
}

void expect_refused_untouched(const StateFile& file) {
  RoundRunner runner = fresh_runner();
  try {
    load_server_state(file.path, runner, "sig");
    ADD_FAILURE() << "the state file was accepted";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find(file.path), std::string::npos) << e.what();
  }
  EXPECT_EQ(runner.rounds_done(), 0);
  EXPECT_TRUE(runner.history().empty());
  EXPECT_TRUE(torch::equal(runner.global(), torch::zeros({2})));
}

TEST(ServerStateFile, MalformedJsonBehindAValidCrcIsCorruptDataNamingTheFile) {
  StateFile file;
  file.write(state_file(payload("[{\"round\": 1,", kOne)));
  expect_refused_untouched(file);
  file.write(state_file(payload("{\"not\": \"a list\"}", kOne)));
  expect_refused_untouched(file);
  file.write(state_file(payload("[{\"round\": \"one\"}]", kOne)));
  expect_refused_untouched(file);
}

TEST(ServerStateFile, AMissingEntryOrAWrongSizedModelLeavesTheRunnerAsItWas) {
  StateFile file;
  core::RecordWriter a;  // a signature and nothing else
  a.add_string("signature", "sig");
  file.write(state_file(a.bytes()));
  expect_refused_untouched(file);
  file.write(state_file(payload("[]", kOne, torch::zeros({3}))));
  expect_refused_untouched(file);
  file.write(state_file(payload("[]", kOne, torch::zeros({2}, torch::kDouble))));
  expect_refused_untouched(file);
}

// The first format (KRABFLS1) was a LibTorch archive, whose loading ran the code in it (and
// whose pickles once threw past every handler: fuzz_server_state's first finding). It is
// refused on its magic, whatever follows, saying why.
TEST(ServerStateFile, TheFirstFormatIsRefusedOnItsMagicSayingWhy) {
  StateFile file;
  file.write(state_file("PK\x03\x04 an archive", "KRABFLS1"));
  expect_refused_untouched(file);
  RoundRunner runner = fresh_runner();
  try {
    load_server_state(file.path, runner, "sig");
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("KRABFLS1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("could run code"), std::string::npos) << e.what();
  }
}

// A file older than the rounds already released (ReleaseCounter's count) is a replay.
TEST(ServerStateFile, AFileSayingFewerRoundsThanWereReleasedIsRefused) {
  StateFile file;
  RoundRunner saved = fresh_runner();
  save_server_state(file.path, saved, "sig");  // 0 rounds done
  RoundRunner runner = fresh_runner();
  EXPECT_TRUE(load_server_state(file.path, runner, "sig", "", "", 0));
  try {
    load_server_state(file.path, runner, "sig", "", "", 2);
    ADD_FAILURE() << "a replayed file was accepted";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("replayed: 2 rounds"), std::string::npos) << e.what();
  }
}

TEST(TransportPayload, ATaskOfAnUnknownKindIsCorruptDataNotACast) {
  // Task{kind: 4}: RemoteTask's kRejoin, which only the client itself may decide.
  EXPECT_THROW(decode_task(std::string("\x08\x04", 2)), CorruptData);
  EXPECT_THROW(decode_task(std::string("\x08\x11", 2)), CorruptData);
  EXPECT_EQ(decode_task(std::string("\x08\x03", 2)).kind, RemoteTask::kDone);
  EXPECT_THROW(decode_task("\xff\xff"), CorruptData);  // not a Task at all
}

TEST(TransportPayload, AnUpdateThatIsNotWholeFloatsIsRefusedNamingTheClient) {
  // TaskResult{update: 5 bytes}
  try {
    decode_fit_result(std::string("\x1a\x05"
                                  "abcde",
                                  7),
                      false, "client 'a'");
    ADD_FAILURE() << "accepted";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("client 'a'"), std::string::npos) << e.what();
  }
  const FitReply r = decode_fit_result(std::string("\x1a\x04\0\0\x80\x3f", 6), false, "c");
  EXPECT_TRUE(torch::equal(r.update, torch::ones({1})));
}

}  // namespace
}  // namespace krab::federated
