// What a federated client trusts its server with: its token comes from a file or the
// environment (the command line with a warning), and a server job that names a path, or a
// TorchScript module other than the client's own copy, is refused before the client reads or
// joins anything.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "core/errors.h"
#include "federated/processes.h"
#include "federated/server_job.h"
#include "federated/tls_files.h"
#include "models/model.h"
#include "support/script_modules.h"
#include "tls_fixture.h"
#include "train/checkpoint.h"

namespace krab::federated {
namespace {

// A client of the test's CA that presents `token` to the server on 127.0.0.1:`port` and gives
// up after one second of retries.
ClientRunOptions client_of(const std::string& dir, const std::string& port,
                           const std::string& token) {
  ClientRunOptions co;
  co.server = "127.0.0.1:" + port;
  co.ca_file = dir + "/ca.pem";
  co.token = token;
  co.retry_s = 1;
  return co;
}

std::string write_token_file(const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("krab-client-token-" + std::to_string(::getpid()) + ".txt"))
                               .string();
  std::ofstream(path) << text;
  return path;
}

// A client's token: from its file (trailing newline removed), the environment, or the command
// line with a warning; a missing or empty file is refused by name.
TEST(Tokens, AClientsTokenComesFromItsFileTheEnvironmentOrWithAWarningTheFlag) {
  const std::string path = write_token_file("token-of-north-0123456789\n");
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::vector<std::string> warnings;
  EXPECT_EQ(client_token({path, "", "from-env-0123456789"}, warnings), "token-of-north-0123456789");
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_EQ(client_token({"", "", "from-env-0123456789"}, warnings), "from-env-0123456789");
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_EQ(client_token({"", "on-the-line-0123456789", "from-env"}, warnings),
            "on-the-line-0123456789");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("`ps` shows it to every user"), std::string::npos) << warnings[0];
  warnings.clear();
  std::filesystem::permissions(
      path, std::filesystem::perms::group_read | std::filesystem::perms::others_read,
      std::filesystem::perm_options::add);
  EXPECT_EQ(client_token({path, "", nullptr}, warnings), "token-of-north-0123456789");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("readable by other users (mode 0644)"), std::string::npos)
      << warnings[0];

  auto refusal = [&](const TokenSources& s) {
    try {
      client_token(s, warnings);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(refusal({path + ".missing", "", "env"}).find("--token-file " + path + ".missing"),
            std::string::npos);
  std::ofstream(path) << "\n";
  EXPECT_NE(refusal({path, "", "env"}).find("--token-file " + path + " is empty"),
            std::string::npos);
  std::filesystem::remove(path);
  EXPECT_NE(refusal({"", "", nullptr}).find("KRAB_FL_TOKEN"), std::string::npos);
  EXPECT_NE(refusal({"", "", ""}).find("KRAB_FL_TOKEN"), std::string::npos);
  EXPECT_NE(refusal({"f", "t", nullptr}).find("not both"), std::string::npos);
}

// A server whose job sets a path (where the client's data is, when it gave no --data; the model
// file) is refused by name at Hello: the client reads nothing and never joins.
TEST_F(Tls, AClientRefusesAServerJobThatSetsAPath) {
  const std::string d = dir_->string();
  std::ofstream(d + "/not-yours.csv") << "x1,label\n0.5,1\n-0.5,0\n0.25,1\n-0.25,0\n";
  for (const std::string key : {"data.path", "model.path"}) {
    ServerTransportOptions so = server_options();
    so.config_yaml = key == "data.path"
                         ? "model: {name: mlp}\ndata: {name: csv, path: " + d + "/not-yours.csv}\n"
                         : "model: {name: torchscript, path: " + d + "/not-yours.csv}\n";
    FederationServer server(so);
    ClientRunOptions co = client_of(d, std::to_string(server.port()), "token-of-alice-0123456");
    std::string why = "(the client ran)";
    try {
      run_fl_client(co);
    } catch (const InvalidArgument& e) {
      why = e.what();
    } catch (const std::exception& e) {
      why = str_cat("(not InvalidArgument) ", e.what());
    }
    EXPECT_NE(why.find("the server's job sets " + key + ":"), std::string::npos) << why;
    EXPECT_EQ(server.wait_for_clients(1, std::chrono::milliseconds(0)), 0u);
  }
}

// A TorchScript federation: the server states its module's SHA-256, a client with another file
// is refused naming both digests before it joins, and a client with its own identical copy
// trains with it.
TEST_F(Tls, ATorchScriptFederationRunsEachClientsOwnCopyOfTheModule) {
  const std::string d = dir_->string();
  torch::manual_seed(5);
  test::ScriptBuilder().net(2, 8, 2).save(d + "/net.ts");
  std::filesystem::copy_file(d + "/net.ts", d + "/mine.ts",
                             std::filesystem::copy_options::overwrite_existing);
  test::ScriptBuilder().net(2, 8, 2).save(d + "/other.ts");  // same shape, other weights
  {
    std::ofstream table(d + "/ts.csv");
    table << "x1,x2,label\n";
    for (int i = 0; i < 200; ++i)
      table << (i % 7) * 0.1 << "," << (i % 3) * 0.2 << "," << i % 2 << "\n";
    std::ofstream(d + "/ts-tokens.txt") << "north token-of-north-0123456789\n";
  }
  core::Config c = core::Config::parse(str_cat(R"(
model: {name: torchscript, path: )",
                                               d, R"(/net.ts}
data: {name: csv, batch_size: 20}
train: {optimizer: {name: sgd, lr: 0.1, momentum: 0}}
federated: {rounds: 1, clients: 1, fraction: 1.0, min_clients: 1, local_steps: 2,
            address: "127.0.0.1:0", wait_clients_s: 30, round_deadline_s: 30}
checkpoint: {dir: )",
                                               d, "/tsrun}\n"),
                                       "test");
  c.set("federated.tls_cert", d + "/server.pem");
  c.set("federated.tls_key", d + "/server.key");
  c.set("federated.tokens", d + "/ts-tokens.txt");
  c.set("federated.eval_data", d + "/ts.csv");
  ServerThread server(c, d + "/ts.port");
  const std::string port = server.port();
  ASSERT_FALSE(port.empty()) << server.error();
  ClientRunOptions co;
  co.server = "127.0.0.1:" + port;
  co.ca_file = d + "/ca.pem";
  co.token = "token-of-north-0123456789";
  co.data = d + "/ts.csv";
  co.model = d + "/other.ts";
  try {
    run_fl_client(co);
    ADD_FAILURE() << "a module with another digest was run";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--model " + co.model + ": SHA-256 "), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(file_sha256(d + "/net.ts", "")), std::string::npos)
        << e.what();
  }
  co.model = d + "/mine.ts";
  EXPECT_EQ(run_fl_client(co), 1);
  server.join();
  EXPECT_TRUE(server.error().empty()) << server.error();
}

// A client holds its model and its data: the forward dry run (train/dry_run.h) refuses a module
// that cannot take the client's examples with one line naming both files, before it joins.
TEST_F(Tls, AClientWhoseModelCannotTakeItsDataIsRefusedBeforeJoining) {
  const std::string d = dir_->string();
  test::ScriptBuilder().net(2, 8, 2).save(d + "/two.ts");  // Linear(2, 8) first
  {
    std::ofstream table(d + "/three.csv");
    table << "x1,x2,x3,label\n";
    for (int i = 0; i < 20; ++i)
      table << i * 0.1 << "," << i * 0.2 << "," << i * 0.3 << "," << i % 2 << "\n";
  }
  models::ModelSpec spec;
  spec.name = "torchscript";
  spec.path = d + "/two.ts";
  ServerTransportOptions so = server_options();
  so.config_yaml = "model: {name: torchscript}\ndata: {name: csv, batch_size: 4}\n";
  so.model_sha256 = file_sha256(spec.path, "");
  so.model_signature = train::model_signature(*models::make_model(spec));
  FederationServer server(so);
  ClientRunOptions co = client_of(d, std::to_string(server.port()), "token-of-alice-0123456");
  co.data = d + "/three.csv";
  co.model = spec.path;
  std::string why = "(the client ran)";
  const char* tmp = std::getenv("TMPDIR");
  const std::string saved_tmp = tmp ? tmp : "";
  ::setenv("TMPDIR", d.c_str(), 1);  // where the traceback's file goes
  try {
    run_fl_client(co);
  } catch (const InvalidArgument& e) {
    why = e.what();
  }
  if (tmp != nullptr)
    ::setenv("TMPDIR", saved_tmp.c_str(), 1);
  else
    ::unsetenv("TMPDIR");
  EXPECT_EQ(why.rfind(str_cat("model.path '", co.model, "': forward on the first 2 examples of ",
                              "data.path '", co.data, "' failed: mat1 and mat2 shapes cannot be ",
                              "multiplied (2x3 and 2x8): a Linear layer expects 2 input features ",
                              "but gets 3"),
                      0),
            0u)
      << why;
  EXPECT_NE(why.find(" (traceback in " + d + "/krab-forward-"), std::string::npos) << why;
  EXPECT_EQ(server.wait_for_clients(1, std::chrono::milliseconds(0)), 0u);
}

}  // namespace
}  // namespace krab::federated
