// The tokens file: what it accepts and how it names a bad line.
#include "federated/transport.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "core/errors.h"
#include "federated/processes.h"
#include "tls_fixture.h"

namespace krab::federated {
namespace {

std::string write_tokens(const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("krab-tokens-" + std::to_string(::getpid()) + ".txt"))
                               .string();
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& text) {
  const std::string path = write_tokens(text);
  try {
    read_tokens(path);
  } catch (const InvalidArgument& e) {
    std::filesystem::remove(path);
    return e.what();
  }
  std::filesystem::remove(path);
  return "(accepted)";
}

TEST(Tokens, ParsesNamesTokensAndExpiry) {
  const std::string path = write_tokens(
      "# clients of the credit-scoring federation\n"
      "north 0123456789abcdef0123\n"
      "\n"
      "south fedcba9876543210fedc 1999999999\n");
  const auto t = read_tokens(path);
  std::filesystem::remove(path);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t.at("0123456789abcdef0123").client, "north");
  EXPECT_EQ(t.at("0123456789abcdef0123").expires, 0);
  EXPECT_EQ(t.at("fedcba9876543210fedc").client, "south");
  EXPECT_EQ(t.at("fedcba9876543210fedc").expires, 1999999999);
}

TEST(Tokens, BadLinesAreNamedByFileAndLine) {
  EXPECT_NE(error_of("a 0123456789abcdef0123\nb short\n").find(":2: token of 'b' is shorter"),
            std::string::npos);
  EXPECT_NE(error_of("a 0123456789abcdef0123 soon\n").find(":1: EXPIRES must be unix seconds"),
            std::string::npos);
  EXPECT_NE(error_of("a 0123456789abcdef0123\na 0123456789abcdef0124\n").find("listed twice"),
            std::string::npos);
  EXPECT_NE(error_of("a 0123456789abcdef0123\nb 0123456789abcdef0123\n").find("another client"),
            std::string::npos);
  EXPECT_NE(error_of("lonely\n").find("expected 'NAME TOKEN [EXPIRES]'"), std::string::npos);
  EXPECT_NE(error_of("# nothing\n").find("lists no clients"), std::string::npos);
  EXPECT_THROW(read_tokens("/nonexistent/tokens.txt"), InvalidArgument);
}

// A client loop in a thread: answers each fit with global * 2 as its update.
void serve_fits(FederationClient& c, int fits) {
  for (int done = 0; done < fits;) {
    RemoteTask t = c.next_task();
    if (t.kind != RemoteTask::kFit) continue;
    FitReply r;
    r.update = t.fit.global * 2;
    r.num_examples = 7;
    c.submit_fit(t.task_id, r);
    ++done;
  }
}

TEST_F(Tls, FitTravelsBothWaysAndWrongModelsAndTokensAreRefused) {
  FederationServer server(server_options());
  FederationClient stranger(client_options(server.port(), "not-a-known-token-000"));
  try {
    stranger.hello();
    FAIL() << "an unknown token was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("token refused: unknown token"), std::string::npos);
  }
  FederationClient alice(client_options(server.port(), "token-of-alice-0123456"));
  const auto hello = alice.hello();
  EXPECT_EQ(hello.client_name, "alice");
  EXPECT_EQ(hello.config_yaml, "name: remote\n");
  try {
    alice.ready("w:[5]", 7);
    FAIL() << "a model of another shape was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("another shape"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(server.available().empty());
  alice.ready("w:[4]", 7);
  ASSERT_EQ(server.available().size(), 1u);
  std::thread t([&] { serve_fits(alice, 1); });
  FitInstruction ins;
  ins.round = 1;
  ins.global = torch::tensor({1.f, -2.f, 3.f, 0.5f});
  const FitReply r = server.available()[0]->fit(ins);
  t.join();
  EXPECT_TRUE(torch::equal(r.update, ins.global * 2));
  EXPECT_EQ(r.num_examples, 7);
  const TransportStats st = server.stats();
  EXPECT_GE(st.bytes_out, 16);  // the 4 floats went out, and came back
  EXPECT_GE(st.bytes_in, 16);
  EXPECT_GE(st.refused_calls, 2);
}

// Certificates and keys are checked before gRPC sees them: one line naming the option and the
// file, never gRPC's own log lines or a generic handshake failure.
TEST_F(Tls, WrongPemFilesAreNamedBeforeAnythingConnects) {
  const std::string d = dir_->string();
  auto error_of = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "(accepted)";
  };
  ClientTransportOptions key_as_ca = client_options(1, "token-of-alice-0123456");
  key_as_ca.ca_file = d + "/server.key";
  std::string e = error_of([&] { FederationClient c(key_as_ca); });
  EXPECT_NE(e.find("--ca: '" + d + "/server.key' holds a private key"), std::string::npos) << e;
  { std::ofstream(d + "/garbage.pem") << "not a certificate\n"; }
  ClientTransportOptions garbage = client_options(1, "token-of-alice-0123456");
  garbage.ca_file = d + "/garbage.pem";
  e = error_of([&] { FederationClient c(garbage); });
  EXPECT_NE(e.find("is not a PEM certificate"), std::string::npos) << e;
  ServerTransportOptions mismatched = server_options();
  mismatched.key_file = d + "/ca.key";  // a real key, but the CA's, not the server's
  e = error_of([&] { FederationServer s(mismatched); });
  EXPECT_NE(e.find("does not belong to the certificate"), std::string::npos) << e;
  ServerTransportOptions cert_as_key = server_options();
  cert_as_key.key_file = d + "/server.pem";
  e = error_of([&] { FederationServer s(cert_as_key); });
  EXPECT_NE(
      e.find("federated.tls_key: '" + d + "/server.pem' is not an unencrypted PEM private key"),
      std::string::npos)
      << e;
}

// --server-name: the name the server's certificate must carry is not taken from --server.
TEST_F(Tls, TheExpectedServerNameCanBeGiven) {
  FederationServer server(server_options());
  ClientTransportOptions other = client_options(server.port(), "token-of-alice-0123456");
  other.server_name = "elsewhere.example";  // the certificate names only 127.0.0.1
  other.timeout = std::chrono::milliseconds(2000);
  FederationClient c(other);
  EXPECT_THROW(c.hello(), PeerLost);
  FederationClient plain(client_options(server.port(), "token-of-alice-0123456"));
  EXPECT_EQ(plain.hello().client_name, "alice");
}

// fl-server on a table: the server's held-out CSV gives the model's shape and the test set;
// each client reads only its own CSV (the README promises CSV data for real federations).
TEST_F(Tls, FlServerTrainsOnCsvTables) {
  const std::string d = dir_->string();
  auto write_table = [](const std::string& path, uint64_t seed, int rows) {
    std::ofstream out(path);
    out << "x1,x2,label\n";
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int i = 0; i < rows; ++i) {
      const double a = u(rng), b = u(rng);
      out << a << "," << b << "," << (a + 0.5 * b > 0 ? 1 : 0) << "\n";
    }
  };
  write_table(d + "/eval.csv", 1, 400);
  write_table(d + "/north.csv", 2, 600);
  write_table(d + "/south.csv", 3, 600);
  {
    std::ofstream(d + "/tokens.txt") << "north token-of-north-0123456789\n"
                                     << "south token-of-south-0123456789\n";
  }
  core::Config c = core::Config::parse(str_cat(R"(
name: csv-fed
model: {name: mlp, hidden: 16}
data: {name: csv, label_column: label, batch_size: 32}
train: {seed: 3, optimizer: {name: sgd, lr: 0.3, momentum: 0}}
federated: {rounds: 4, clients: 2, fraction: 1.0, min_clients: 2, address: "127.0.0.1:0",
            wait_clients_s: 60, round_deadline_s: 30}
checkpoint: {dir: )",
                                               d, "/csvrun}\n"),
                                       "test");
  c.set("federated.tls_cert", d + "/server.pem");
  c.set("federated.tls_key", d + "/server.key");
  c.set("federated.tokens", d + "/tokens.txt");
  c.set("federated.eval_data", d + "/eval.csv");
  ServerThread server(c, d + "/csv.port");
  const std::string port = server.port();
  ASSERT_FALSE(port.empty()) << server.error();
  std::vector<std::thread> clients;
  std::vector<int64_t> rounds(2, -1);
  for (int i = 0; i < 2; ++i)
    clients.emplace_back([&, i] {
      ClientRunOptions co;
      co.server = "127.0.0.1:" + port;
      co.ca_file = d + "/ca.pem";
      co.token = i == 0 ? "token-of-north-0123456789" : "token-of-south-0123456789";
      co.data = d + (i == 0 ? "/north.csv" : "/south.csv");
      try {
        rounds[i] = run_fl_client(co);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "client " << i << ": " << e.what();
      }
    });
  for (auto& t : clients) t.join();
  const nlohmann::json report = server.join();
  ASSERT_TRUE(server.error().empty()) << server.error();
  EXPECT_EQ(rounds, std::vector<int64_t>({4, 4}));
  ASSERT_EQ(report["rounds"].size(), 4u);
  for (const auto& r : report["rounds"]) EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
  // A linear rule in two features: far above the majority class (about 0.5).
  EXPECT_GT(report["test_accuracy"].get<double>(), 0.85);
}

// The resident memory of process `pid` in bytes (VmRSS), or -1.
int64_t resident_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  int64_t kb = -1;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 20, '\n');
  }
  return -1;
}

// A stranger's large calls are refused on their headers: the server never reads, so never
// buffers, their bodies. Measured on a real fl-server process (this process's own memory holds
// the attacker's messages): six concurrent 60 MiB calls without a valid token once took the
// server from 171 MB to 760 MB.
TEST_F(Tls, CallsWithoutAValidTokenAreRefusedBeforeTheirBodyIsRead) {
  const std::string krab = std::string(KRAB_BINARY_DIR) + "/bin/krab";
  if (!std::filesystem::exists(krab)) GTEST_SKIP() << "no " << krab << " in this build";
  const std::string d = dir_->string();
  {
    std::ofstream(d + "/gate-tokens.txt") << "alice token-of-alice-0123456789\n";
    std::ofstream(d + "/gate.yaml") << "name: gate\nmodel: {name: mlp, hidden: 8}\n"
                                    << "data: {name: synthetic, synthetic_samples: 200}\n"
                                    << "federated: {clients: 1, min_clients: 1, "
                                       "wait_clients_s: 120, max_message_mb: 100, "
                                       "address: \"127.0.0.1:0\", tls_cert: "
                                    << d << "/server.pem, tls_key: " << d
                                    << "/server.key, tokens: " << d << "/gate-tokens.txt}\n"
                                    << "checkpoint: {dir: " << d << "/gaterun}\n";
  }
  const std::string port_file = d + "/gate.port";
  std::filesystem::remove(port_file);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string job = d + "/gate.yaml";
    ::execl(krab.c_str(), "krab", "fl-server", job.c_str(), "--port-file", port_file.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  for (int i = 0; i < 600 && !std::filesystem::exists(port_file); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(std::filesystem::exists(port_file));
  std::string port;
  std::ifstream(port_file) >> port;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // settle after start-up
  const int64_t before = resident_bytes(pid);
  std::atomic<bool> done{false};
  std::atomic<int64_t> peak{before};
  std::thread sampler([&] {
    while (!done) {
      peak = std::max<int64_t>(peak, resident_bytes(pid));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::vector<std::thread> attackers;
  std::atomic<int> refused{0};
  for (int i = 0; i < 6; ++i)
    attackers.emplace_back([&, i] {
      ClientTransportOptions o;
      o.server = "127.0.0.1:" + port;
      o.ca_file = d + "/ca.pem";
      o.token = i % 2 ? "not-a-token-of-anyone-000" : "";
      if (o.token.empty()) o.token = "x";  // the client insists on a token; any wrong one
      o.max_message_bytes = 100 << 20;
      o.timeout = std::chrono::milliseconds(20000);
      FederationClient stranger(o);
      FitReply reply;
      reply.update = torch::ones({15 << 20});  // 60 MiB
      reply.num_examples = 1;
      try {
        stranger.submit_fit(1, reply);
      } catch (const InvalidArgument& e) {
        refused += std::string(e.what()).find("token refused") != std::string::npos;
      }
    });
  for (auto& t : attackers) t.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  done = true;
  sampler.join();
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_EQ(refused, 6);
  ASSERT_GT(before, 0);
  EXPECT_LT(peak - before, int64_t{100} << 20)
      << "the server grew from " << before / 1e6 << " MB to " << peak / 1e6 << " MB";
}

// Mutual TLS: a token is good only with its own client's certificate (common name = the
// token's client name), so a stolen token is useless without the matching key.
TEST_F(Tls, UnderMutualTlsATokenNeedsItsOwnClientsCertificate) {
  const std::string d = dir_->string();
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  for (const char* who : {"alice", "mallory"}) {
    const std::string cmd =
        "cd " + d + " && openssl req " + ec + " -subj /CN=" + who + " -keyout " + who +
        ".key -out " + who + ".csr" + " && openssl x509 -req -in " + who +
        ".csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -out " + who + ".pem";
    ASSERT_EQ(std::system((cmd + " >/dev/null 2>&1").c_str()), 0) << cmd;
  }
  ServerTransportOptions so = server_options();
  so.client_ca_file = d + "/ca.pem";
  FederationServer server(so);
  auto client = [&](const std::string& cert) {
    ClientTransportOptions o = client_options(server.port(), "token-of-alice-0123456");
    o.cert_file = d + "/" + cert + ".pem";
    o.key_file = d + "/" + cert + ".key";
    return o;
  };
  FederationClient alice(client("alice"));
  EXPECT_EQ(alice.hello().client_name, "alice");
  FederationClient thief(client("mallory"));
  try {
    thief.hello();
    FAIL() << "alice's token was accepted with mallory's certificate";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("common name is 'alice'"), std::string::npos) << e.what();
  }
}

// Ports out of range are refused with the option named (gRPC would wrap 99999 to 34463).
TEST_F(Tls, OutOfRangePortsAreRefused) {
  ServerTransportOptions so = server_options();
  so.address = "127.0.0.1:99999";
  try {
    FederationServer s(so);
    FAIL() << "listened on port 99999";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("federated.address: port '99999'"), std::string::npos)
        << e.what();
  }
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:-1", "127.0.0.1:7x"}) {
    ClientTransportOptions co = client_options(1, "token-of-alice-0123456");
    co.server = bad;
    EXPECT_THROW(FederationClient c(co), InvalidArgument) << bad;
  }
}

// The tokens file may hold digests only: the server needs no token, and a digest is no token.
TEST_F(Tls, ATokensFileOfDigestsAuthenticatesTheTokens) {
  const std::string d = dir_->string();
  {
    // printf %s token-of-alice-0123456 | sha256sum
    std::ofstream(d + "/digests.txt")
        << "alice sha256:"
        << "d5d5d65bea1c126a52318b353751f66961663b78270c2cd807a0168a21bae5eb\n";
  }
  std::ofstream(d + "/bad-digest.txt") << "alice sha256:1234\n";
  EXPECT_THROW(read_tokens(d + "/bad-digest.txt"), InvalidArgument);
  const auto tokens = read_tokens(d + "/digests.txt");
  ASSERT_EQ(tokens.size(), 1u);
  // The digest of the test's token, computed here by the same tool users would use.
  std::string want;
  {
    FILE* p = ::popen("printf %s token-of-alice-0123456 | sha256sum", "r");
    ASSERT_NE(p, nullptr);
    char buf[65] = {};
    ASSERT_EQ(std::fread(buf, 1, 64, p), 64u);
    ::pclose(p);
    want = buf;
  }
  ASSERT_EQ(tokens.begin()->first, "sha256:" + want);
  ServerTransportOptions so = server_options();
  so.tokens = tokens;
  FederationServer server(so);
  FederationClient alice(client_options(server.port(), "token-of-alice-0123456"));
  EXPECT_EQ(alice.hello().client_name, "alice");
  FederationClient digest_holder(client_options(server.port(), "sha256:" + want));
  EXPECT_THROW(digest_holder.hello(), InvalidArgument);
}

// A copied token neither joins a second time nor takes the holder's tasks; the holder goes on.
TEST_F(Tls, ASecondHolderOfATokenIsRefusedAndCannotTakeTasks) {
  FederationServer server(server_options());
  FederationClient alice(client_options(server.port(), "token-of-alice-0123456"));
  alice.ready("w:[4]", 7);
  FederationClient copy(client_options(server.port(), "token-of-alice-0123456"));
  try {
    copy.ready("w:[4]", 7);
    FAIL() << "a second holder of the token joined";
  } catch (const TokenInUse& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  // Without the holder's session it cannot poll for (and so cancel or steal) her tasks.
  EXPECT_THROW(copy.next_task(), InvalidArgument);
  std::thread t([&] { serve_fits(alice, 1); });
  FitInstruction ins;
  ins.round = 1;
  ins.global = torch::ones({4});
  EXPECT_TRUE(torch::equal(server.available()[0]->fit(ins).update, torch::full({4}, 2.f)));
  t.join();
  EXPECT_GE(server.stats().refused_calls, 2);
}

TEST_F(Tls, AnOversizedMessageIsRefusedAndTheServerGoesOn) {
  ServerTransportOptions so = server_options();
  so.deadline = std::chrono::milliseconds(1000);
  so.liveness = std::chrono::milliseconds(600);
  FederationServer server(so);
  ClientTransportOptions small = client_options(server.port(), "token-of-alice-0123456");
  small.max_message_bytes = 4096;
  FederationClient alice(small);
  alice.hello();
  alice.ready("w:[4]", 7);
  std::string client_error;
  std::thread t([&] {
    try {
      for (;;) {
        RemoteTask task = alice.next_task();
        if (task.kind == RemoteTask::kDone) return;
      }
    } catch (const InvalidArgument& e) {
      client_error = e.what();
    }
  });
  FitInstruction ins;
  ins.round = 1;
  ins.global = torch::zeros({4000});  // 16 kB: above the client's 4 kB
  Participant* p = server.available()[0];
  EXPECT_THROW(p->fit(ins), Timeout);  // the client never got it: the deadline ends the wait
  t.join();
  EXPECT_NE(client_error.find("message too large"), std::string::npos) << client_error;
  // The server still serves: a well-behaved client with the default limit gets a small task.
  // It is alice again, restarted: her token is hers once her old session has been silent for
  // the liveness period.
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  FederationClient again(client_options(server.port(), "token-of-alice-0123456"));
  again.ready("w:[4]", 7);
  std::thread t2([&] { serve_fits(again, 1); });
  ins.global = torch::ones({4});
  EXPECT_TRUE(torch::equal(server.available()[0]->fit(ins).update, torch::full({4}, 2.f)));
  t2.join();
}

}  // namespace
}  // namespace krab::federated
