// The TLS test fixture of the federated transport's tests (transport_test.cpp,
// client_trust_test.cpp): a CA and a server certificate for 127.0.0.1 made with openssl once
// per suite, and transport options that use them. One suite, `Tls`, across both files; and a
// real fl-server on a thread of its own (ServerThread).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "federated/processes.h"
#include "federated/transport.h"

namespace krab::federated {

// A CA and a server certificate for 127.0.0.1, made with openssl for this test.
class Tls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("krab-tls-" + std::to_string(::getpid())));
    std::filesystem::create_directories(*dir_);
    const std::string d = dir_->string();
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string cmd =
        "cd " + d + " && openssl req -x509 " + ec +
        " -days 1 -subj /CN=ca -keyout ca.key -out ca.pem" + " && openssl req " + ec +
        " -subj /CN=localhost -keyout server.key -out server.csr" +
        " && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext" +
        " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1" +
        " -extfile san.ext -out server.pem 2>/dev/null >/dev/null";
    ASSERT_EQ(std::system((cmd + " 2>/dev/null").c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  ServerTransportOptions server_options() const {
    ServerTransportOptions o;
    o.address = "127.0.0.1:0";
    o.cert_file = (*dir_ / "server.pem").string();
    o.key_file = (*dir_ / "server.key").string();
    o.tokens["token-of-alice-0123456"] = {"alice", 0};
    o.config_yaml = "name: remote\n";
    o.model_signature = "w:[4]";
    o.poll_timeout = std::chrono::milliseconds(200);
    o.deadline = std::chrono::milliseconds(5000);
    return o;
  }
  ClientTransportOptions client_options(int port, const std::string& token) const {
    ClientTransportOptions o;
    o.server = "127.0.0.1:" + std::to_string(port);
    o.ca_file = (*dir_ / "ca.pem").string();
    o.token = token;
    o.timeout = std::chrono::milliseconds(5000);
    return o;
  }
  inline static std::filesystem::path* dir_ = nullptr;
};

// run_fl_server(config) on a thread of its own, writing its port to `port_file`. port() waits for
// that file (up to 15 s) and returns "" if it never came; join() waits for the server's end and
// returns its report; error() is what it threw ("" if nothing), to read after join() or once
// port() has failed. The destructor joins.
class ServerThread {
 public:
  ServerThread(const core::Config& config, const std::string& port_file) {
    options_.port_file = port_file;
    options_.show_progress = false;
    thread_ = std::thread([this, config] {
      try {
        report_ = run_fl_server(config, options_);
      } catch (const std::exception& e) {
        error_ = e.what();
      }
    });
  }
  ~ServerThread() {
    if (thread_.joinable()) thread_.join();
  }
  std::string port() const {
    for (int i = 0; i < 300 && !std::filesystem::exists(options_.port_file); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string port;
    std::ifstream(options_.port_file) >> port;
    return port;
  }
  nlohmann::json join() {
    thread_.join();
    return report_;
  }
  const std::string& error() const { return error_; }

 private:
  ServerRunOptions options_;
  std::thread thread_;
  nlohmann::json report_;
  std::string error_;
};

}  // namespace krab::federated
