#include "cli/job_agreement.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include "core/errors.h"

#ifndef KRAB_VERSION
#define KRAB_VERSION "unknown"
#endif

namespace krab::cli {
namespace {

// SHA-256 of a file's bytes, as 64 hex digits; "" when it cannot be read. A cryptographic hash
// rather than a checksum: a node that wants another's fingerprint while training something else
// would have to find a second file with the same SHA-256, not just patch 64 bits of FNV.
std::string file_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  KRAB_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "SHA-256 init");
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    KRAB_CHECK(EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount())) == 1,
               "SHA-256 update");
  }
  if (in.bad()) return "";
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  KRAB_CHECK(EVP_DigestFinal_ex(ctx.get(), digest, &length) == 1, "SHA-256 final");
  std::string hex;
  char byte[3];
  for (unsigned int i = 0; i < length; ++i) {
    std::snprintf(byte, sizeof(byte), "%02x", digest[i]);
    hex += byte;
  }
  return hex;
}

// Two nodes running different builds are told so even when both say the same version. The
// executable is a few MB (LibTorch is a shared library), hashed once.
std::string binary_id() {
  return str_cat("krab ", KRAB_VERSION, " (executable ", file_digest("/proc/self/exe"), ")");
}

// What a file-valued key stands for on this node: its content, not where the node keeps it.
std::string content_text(const std::string& path) {
  if (path.empty()) return "(none)";
  const std::string digest = file_digest(path);
  if (digest.empty()) return "(unreadable on this node)";
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  return str_cat("file content ", digest, ", ", ec ? 0 : bytes, " bytes");
}

// The resolved value of `key` in Config::to_json()'s nested object, as text.
std::string value_text(const nlohmann::json& root, const std::string& key) {
  const nlohmann::json* node = &root;
  for (size_t begin = 0;;) {
    const size_t dot = key.find('.', begin);
    node = &node->at(key.substr(begin, dot - begin));
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  std::string text = node->is_string() ? node->get<std::string>() : node->dump();
  for (size_t at = 0; (at = text.find_first_of("\n\t", at)) != std::string::npos;)
    text.replace(at, 1, text[at] == '\n' ? "\\n" : "\\t");
  return text;
}

std::string key_of(int node) { return str_cat("krab/job/", node); }

}  // namespace

const std::vector<std::string>& per_node_keys() {
  static const std::vector<std::string> keys = {
      "name",           "checkpoint.dir",    "checkpoint.hmac_key_file", "data.path",
      "data.test_path", "comm.iface",        "train.threads_per_worker", "monitor.port",
      "monitor.bind",   "monitor.dashboard", "monitor.profile_ops"};
  return keys;
}

const std::set<std::string>& content_keys() {
  static const std::set<std::string> keys = {"model.path", "data.tokenizer.sentencepiece"};
  return keys;
}

namespace {
constexpr const char* kNodesEntry = "--nnodes";
constexpr const char* kPerNodeEntry =
    "workers per node (--nproc-per-node or parallel.workers / --nnodes)";
}  // namespace

Fingerprint without_geometry(const Fingerprint& f) {
  Fingerprint out;
  for (const auto& entry : f)
    if (entry.first != kNodesEntry && entry.first != kPerNodeEntry) out.push_back(entry);
  return out;
}

Fingerprint job_fingerprint(const core::Config& config, int nnodes, int per_node) {
  Fingerprint f;
  f.emplace_back("krab binary", binary_id());
  f.emplace_back(kNodesEntry, std::to_string(nnodes));
  f.emplace_back(kPerNodeEntry, std::to_string(per_node));
  const nlohmann::json values = config.to_json();
  const auto& skip = per_node_keys();
  for (const core::KeySpec& spec : core::registry()) {
    if (std::find(skip.begin(), skip.end(), spec.key) != skip.end()) continue;
    // parallel.workers only matters through the workers per node above.
    if (spec.key == "parallel.workers") continue;
    if (content_keys().count(spec.key) != 0) {
      f.emplace_back(spec.key, content_text(config.get_string(spec.key)));
      continue;
    }
    f.emplace_back(spec.key, value_text(values, spec.key));
  }
  return f;
}

std::string encode(const Fingerprint& f) {
  std::string out;
  for (const auto& [k, v] : f) out += k + "\t" + v + "\n";
  return out;
}

Fingerprint decode(const std::string& text) {
  Fingerprint f;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    f.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  return f;
}

std::string first_difference(const Fingerprint& node0, const Fingerprint& theirs, int node) {
  auto value_in = [](const Fingerprint& f, const std::string& key) -> const std::string* {
    for (const auto& [k, v] : f)
      if (k == key) return &v;
    return nullptr;
  };
  auto line = [node](const std::string& key, const std::string& a, const std::string& b) {
    return str_cat("node ", node, "'s job differs from node 0's at key ", key, ": '", a, "' vs '",
                   b, "'");
  };
  for (const auto& [k, v0] : node0) {
    const std::string* v = value_in(theirs, k);
    if (v == nullptr) return line(k, "(no such key)", v0);
    if (*v != v0) return line(k, *v, v0);
  }
  for (const auto& [k, v] : theirs)
    if (value_in(node0, k) == nullptr) return line(k, v, "(no such key)");
  return "";
}

Node0Outputs agree_on_job(const comm::StorePtr& store, int node_rank, int nnodes,
                          const Fingerprint& mine, const Node0Outputs& outputs,
                          const comm::Endpoint& rendezvous, std::chrono::milliseconds timeout) {
  const std::string seconds = str_cat(timeout.count() / 1000.0, " s");
  auto as_bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  auto read = [&](int node) {
    const auto v = store->get(key_of(node));
    return decode(std::string(v.begin(), v.end()));
  };
  // Claim the node rank: a second node with the same --node-rank gets 2.
  KRAB_CHECK_ARG(store->add(str_cat("krab/node/", node_rank), 1) == 1, "--node-rank ", node_rank,
                 ": another node already joined the rendezvous at ", rendezvous.to_string(),
                 " as node ", node_rank);
  if (node_rank != 0) {
    try {
      store->wait({key_of(0)}, timeout);
    } catch (const std::exception&) {
      throw Timeout(str_cat("node 0 did not publish its job at the rendezvous ",
                            rendezvous.to_string(), " within comm.timeout_s = ", seconds));
    }
    const Fingerprint node0 = read(0);
    const auto where = store->get("krab/outputs");
    store->set(key_of(node_rank), as_bytes(encode(mine)));
    const std::string diff = first_difference(node0, mine, node_rank);
    if (!diff.empty()) throw InvalidArgument(diff);
    const std::string text(where.begin(), where.end());
    const size_t nl = text.find('\n');
    return {text.substr(0, nl), nl == std::string::npos ? "" : text.substr(nl + 1)};
  }
  // The outputs first: a node that sees job/0 finds them there.
  store->set("krab/outputs", as_bytes(outputs.run_dir + "\n" + outputs.report));
  store->set(key_of(0), as_bytes(encode(mine)));
  // One node at a time, so a node that differs is named at once instead of after waiting for
  // a node that will never come (one started with another --nnodes, say).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int n = 1; n < nnodes; ++n) {
    try {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      store->wait({key_of(n)}, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      std::string missing;
      for (int m = n; m < nnodes; ++m)
        if (!store->check({key_of(m)}))
          missing += (missing.empty() ? "" : ", ") + std::to_string(m);
      throw Timeout(str_cat("node(s) ", missing, " did not reach the rendezvous at ",
                            rendezvous.to_string(), " within comm.timeout_s = ", seconds,
                            " (started with the same --rdzv and --nnodes?)"));
    }
    const std::string diff = first_difference(mine, read(n), n);
    if (!diff.empty()) throw InvalidArgument(diff);
  }
  return outputs;
}

}  // namespace krab::cli
