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
#include "federated/server_state.h"
#include "federated/transport_payload.h"

namespace krab::federated {
namespace {

namespace fs = std::filesystem;

// fl-state.krab around `payload` with a valid header (magic, length, CRC-32).
std::string state_file(const std::string& payload) {
  std::string out("KRABFLS1", 8);
  const uint64_t length = payload.size();
  const uint32_t crc = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  out.append(reinterpret_cast<const char*>(&length), 8);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return out + payload;
}

// A payload like save_server_state's, with `history` and `keys` as given.
std::string payload(const std::string& history, const std::string& keys,
                    const at::Tensor& global = torch::zeros({2})) {
  torch::serialize::OutputArchive a;
  a.write("global_model", global);
  a.write("rounds_done", torch::tensor(int64_t{1}, torch::kLong));
  a.write("history", c10::IValue(history));
  a.write("signature", c10::IValue(std::string("sig")));
  a.write("strategy_keys", c10::IValue(keys));
  a.write("strategy_rounds", torch::tensor(int64_t{1}, torch::kLong));
  std::ostringstream os;
  a.save_to(os);
  return os.str();
}

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
  file.write(state_file(payload("[{\"round\": 1,", "[\"rounds\"]")));
  expect_refused_untouched(file);
  file.write(state_file(payload("[]", "{\"not\": \"a list\"}")));
  expect_refused_untouched(file);
  file.write(state_file(payload("[{\"round\": \"one\"}]", "[\"rounds\"]")));
  expect_refused_untouched(file);
}

TEST(ServerStateFile, AMissingEntryOrAWrongSizedModelLeavesTheRunnerAsItWas) {
  StateFile file;
  torch::serialize::OutputArchive a;  // a signature and nothing else
  a.write("signature", c10::IValue(std::string("sig")));
  std::ostringstream os;
  a.save_to(os);
  file.write(state_file(os.str()));
  expect_refused_untouched(file);
  file.write(state_file(payload("[]", "[\"rounds\"]", torch::zeros({3}))));
  expect_refused_untouched(file);
}

// fuzz_server_state's first finding: a pickle naming a class TorchScript does not know made
// load_from() throw torch::jit::ErrorReport, which is not a c10::Error, past every handler.
TEST(ServerStateFile, AnUnknownPickledClassIsCorruptData) {
  StateFile file;
  RoundRunner saved = fresh_runner();
  save_server_state(file.path, saved, "sig");
  std::string bytes;
  {
    std::ifstream in(file.path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string body = bytes.substr(20);
  const size_t at = body.find("_rebuild_tensor_v2");
  ASSERT_NE(at, std::string::npos);
  body[at + 17] = '1';  // torch._utils._rebuild_tensor_v1: no such type
  file.write(state_file(body));
  expect_refused_untouched(file);
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
