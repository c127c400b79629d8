// What a federated client takes from its server's job: the listed keys, never a path, and a
// TorchScript module only as its own file with the server's digest.
#include "federated/server_job.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/errors.h"

namespace krab::federated {
namespace {

std::string refusal(const std::string& yaml, const std::string& sha = "", const LocalJob& l = {}) {
  try {
    client_job(yaml, sha, l);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

// A server job as an operator writes it: its own files everywhere.
core::Config server_config() {
  core::Config c = core::Config::parse(R"(
name: fed
model: {name: mlp, hidden: 48, path: /srv/models/m.pt}
data: {name: csv, label_column: y, batch_size: 16, path: /srv/secret.csv, test_path: /srv/t}
train: {seed: 9, optimizer: {name: adam, lr: 0.002}}
federated: {local_steps: 7, tokens: /srv/tokens.txt, eval_data: /srv/eval.csv,
            tls_cert: /srv/s.pem, tls_key: /srv/s.key}
checkpoint: {dir: /srv/run, hmac_key_file: /srv/key}
)",
                                       "test");
  return c;
}

TEST(ServerJob, AnHonestServerSendsTheListedKeysAndNoPath) {
  const core::Config server = server_config();
  const std::string job = job_for_clients(server);
  EXPECT_EQ(job.find("/srv"), std::string::npos) << job;
  const core::Config client = client_job(job, "", {"/home/me/mine.csv", ""});
  for (const std::string& key : server_job_keys()) {
    EXPECT_TRUE(client.is_set(key)) << key;
    EXPECT_EQ(client.to_json()[nlohmann::json::json_pointer("/" + key)].dump(),
              server.to_json()[nlohmann::json::json_pointer("/" + key)].dump())
        << key;
  }
  EXPECT_EQ(client.get_string("data.path"), "/home/me/mine.csv");
  EXPECT_EQ(client.get_int("model.hidden"), 48);
  EXPECT_EQ(client.get_float("train.optimizer.lr"), 0.002);
  // Everything else is the client's default, not the server's.
  EXPECT_EQ(client.get_string("model.path"), "");
  EXPECT_EQ(client.get_string("data.test_path"), "");
  EXPECT_EQ(client.get_string("checkpoint.dir"), core::Config().get_string("checkpoint.dir"));
  // Without --data the client reads the registry's default place, never the server's path.
  EXPECT_EQ(client_job(job, "", {}).get_string("data.path"),
            core::Config().get_string("data.path"));
}

TEST(ServerJob, PathsAndOtherUnlistedKeysAreRefusedByName) {
  const std::pair<const char*, const char*> keys[] = {
      {"model.path", "/etc/passwd"},
      {"data.path", "/home/someone/else.csv"},
      {"data.tokenizer.sentencepiece", "/etc/passwd"},
      {"data.test_path", "/etc"},
      {"federated.tokens", "/etc/passwd"},
      {"federated.eval_data", "/etc"},
      {"federated.tls_cert", "/etc/passwd"},
      {"checkpoint.dir", "/tmp/x"},
      {"checkpoint.hmac_key_file", "/etc/passwd"},
      {"data.cache_mb", "100000"},
      {"train.threads_per_worker", "64"},
      {"federated.dp", "none"}};
  for (const auto& [key, value] : keys) {
    const std::string why = refusal(str_cat("model: {name: mlp}\n", key, ": ", value, "\n"));
    EXPECT_NE(why.find(str_cat("sets ", key, ":")), std::string::npos) << key << ": " << why;
  }
  // What main's server sent (the whole job, 8 paths blanked): every unlisted key is named.
  core::Config old = server_config();
  for (const char* key :
       {"federated.tls_cert", "federated.tls_key", "federated.tls_client_ca", "federated.tokens",
        "federated.eval_data", "checkpoint.dir", "checkpoint.hmac_key_file", "data.path"})
    old.set(key, "");
  const std::string why = refusal(old.to_yaml());
  for (const char* key : {"model.path", "data.tokenizer.sentencepiece", "data.test_path",
                          "data.path", "federated.rounds"})
    EXPECT_NE(why.find(key), std::string::npos) << key << ": " << why;
}

class ModelFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() / str_cat("krab-module-", ::getpid(), ".pt"))
                .string();
    std::ofstream(path_) << "abc";
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_;
};

// FIPS 180-2's first example: SHA-256("abc").
constexpr const char* kAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

TEST_F(ModelFile, ATorchScriptModelIsTheClientsOwnFileWithTheServersDigest) {
  EXPECT_EQ(file_sha256(path_, "--model"), kAbc);
  const std::string job = "model: {name: torchscript}\n";
  EXPECT_NE(refusal(job, kAbc).find("--model FILE"), std::string::npos) << refusal(job, kAbc);
  std::string other(kAbc);
  other[0] = 'c';
  const std::string why = refusal(job, other, {"", path_});
  EXPECT_NE(why.find("--model " + path_ + ": SHA-256 " + kAbc), std::string::npos) << why;
  EXPECT_NE(why.find(other), std::string::npos) << why;
  EXPECT_NE(refusal(job, "", {"", path_}).find("states no SHA-256"), std::string::npos);
  EXPECT_EQ(client_job(job, kAbc, {"", path_}).get_string("model.path"), path_);
  // The server cannot point a client at a module, even one with the right digest.
  EXPECT_NE(refusal("model: {name: torchscript, path: " + path_ + "}\n", kAbc, {"", path_})
                .find("sets model.path:"),
            std::string::npos);
  // --model with a built-in model is a mistake, said so.
  EXPECT_NE(refusal("model: {name: mlp}\n", "", {"", path_}).find("not a TorchScript"),
            std::string::npos);
  EXPECT_THROW(file_sha256(path_ + ".missing", "--model"), InvalidArgument);
}

}  // namespace
}  // namespace krab::federated
