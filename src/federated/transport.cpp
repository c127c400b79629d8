// The only file that includes gRPC and the generated federated protocol (STYLE.md: transports
// stay in their own translation unit).
#include "federated/transport.h"

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <climits>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "core/errors.h"
#include "core/fs.h"
#include "core/printable.h"
#include "federated/fl.grpc.pb.h"
#include "federated/tls_files.h"
#include "federated/transport_payload.h"

namespace krab::federated {

struct FederationServerState;

namespace {

using Clock = std::chrono::steady_clock;

std::string tensor_bytes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous().to(at::kFloat).cpu();
  return std::string(reinterpret_cast<const char*>(c.data_ptr<float>()),
                     static_cast<size_t>(c.numel()) * 4);
}

at::Tensor bytes_tensor(const std::string& b, const std::string& who) {
  if (b.size() % 4 != 0)
    throw CorruptData(str_cat(who, ": update of ", b.size(), " bytes is not float32 values"));
  at::Tensor t = at::empty({static_cast<int64_t>(b.size() / 4)}, at::kFloat);
  if (!b.empty()) std::memcpy(t.data_ptr<float>(), b.data(), b.size());
  return t;
}

// A Task as the client sees it (next_task(), decode_task()). Everything in it came from the
// network: an unknown kind is refused rather than cast, since RemoteTask's kinds go beyond the
// wire's (kRejoin is local) and a value outside an enum's range is undefined behaviour.
RemoteTask task_from_wire(const wire::Task& t) {
  if (!wire::Task::Kind_IsValid(t.kind()))
    throw CorruptData(str_cat("the server sent a task of unknown kind ", static_cast<int>(t.kind()),
                              " (is it a newer krab?)"));
  RemoteTask out;
  out.kind = static_cast<RemoteTask::Kind>(t.kind());
  out.task_id = t.task_id();
  if (t.kind() == wire::Task::FIT) {
    out.fit.round = t.round();
    out.fit.global = bytes_tensor(t.global(), "the server's global model");
    out.fit.proximal_mu = t.proximal_mu();
    out.fit.clip_norm = t.clip_norm();
    out.fit.local_noise_std = t.local_noise_std();
    out.fit.secure = t.secure();
    out.fit.secagg_id = t.secagg_id();
    out.fit.secagg_threshold = t.secagg_threshold();
    out.fit.secagg_clients = t.secagg_clients();
    out.fit.secagg_clip = t.secagg_clip();
  } else if (t.kind() == wire::Task::SECAGG) {
    KRAB_CHECK_ARG(t.stage() >= 1 && t.stage() <= 3, "secure aggregation: unknown stage ",
                   t.stage());
    out.secagg.stage = static_cast<SecAggRequest::Stage>(t.stage());
    out.secagg.weight = t.weight();
    out.secagg.payload.assign(t.payload().begin(), t.payload().end());
  }
  return out;
}

// A client's answer to a fit task as the server sees it (RemoteParticipant::fit(),
// decode_fit_result()).
FitReply fit_reply_from_wire(const wire::TaskResult& r, bool secure, const std::string& who) {
  FitReply reply;
  reply.num_examples = r.num_examples();
  reply.mean_loss = r.mean_loss();
  if (secure) {
    reply.secagg.assign(r.secagg().begin(), r.secagg().end());
  } else {
    reply.update = bytes_tensor(r.update(), who);
  }
  return reply;
}

}  // namespace

namespace {

constexpr std::string_view kDigestPrefix = "sha256:";

// The digest the server keeps for a tokens-file entry: the SHA-256 of a plain token, or the
// digest itself when the file holds "sha256:HEX" (so the server never needs the token).
std::string token_digest(const std::string& entry) {
  if (entry.rfind(kDigestPrefix, 0) != 0) return sha256(entry);
  std::string out(32, '\0');
  for (size_t i = 0; i < 32; ++i)
    out[i] =
        static_cast<char>(std::stoi(entry.substr(kDigestPrefix.size() + 2 * i, 2), nullptr, 16));
  return out;
}

}  // namespace

std::map<std::string, TokenInfo> read_tokens(const std::string& path) {
  KRAB_CHECK_ARG(core::path_exists(path), "federated.tokens: file '", path, "' does not exist");
  std::istringstream in(core::read_file(path));
  std::map<std::string, TokenInfo> out;
  std::set<std::string> names;
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    std::istringstream ls(line);
    std::string name, token, expires, extra;
    if (!(ls >> name) || name[0] == '#') continue;
    const std::string where = str_cat(path, ":", no, ": ");
    KRAB_CHECK_ARG(static_cast<bool>(ls >> token), where, "expected 'NAME TOKEN [EXPIRES]'");
    if (token.rfind(kDigestPrefix, 0) == 0)
      KRAB_CHECK_ARG(token.size() == kDigestPrefix.size() + 64 &&
                         token.find_first_not_of("0123456789abcdef", kDigestPrefix.size()) ==
                             std::string::npos,
                     where, "token of '", name, "': ", kDigestPrefix,
                     " must be followed by 64 lower-case hex digits (sha256sum's output)");
    else
      KRAB_CHECK_ARG(token.size() >= 16, where, "token of '", name,
                     "' is shorter than 16 characters");
    TokenInfo info{name, 0};
    if (ls >> expires) {
      try {
        size_t used = 0;
        info.expires = std::stoll(expires, &used);
        KRAB_CHECK_ARG(used == expires.size(), "");
      } catch (const std::exception&) {
        throw InvalidArgument(str_cat(where, "EXPIRES must be unix seconds, got '", expires, "'"));
      }
    }
    KRAB_CHECK_ARG(!(ls >> extra), where, "unexpected '", extra, "' after EXPIRES");
    KRAB_CHECK_ARG(names.insert(name).second, where, "client '", name, "' listed twice");
    KRAB_CHECK_ARG(out.emplace(token, info).second, where, "token of '", name,
                   "' is also another client's");
  }
  KRAB_CHECK_ARG(!out.empty(), "federated.tokens: file '", path, "' lists no clients");
  return out;
}

namespace {

// HOST:PORT with PORT a whole number in 1..65535 (0 too where it means "any free port").
void check_host_port(const std::string& text, const char* what, bool allow_zero) {
  const size_t colon = text.rfind(':');
  KRAB_CHECK_ARG(colon != std::string::npos && colon > 0 && colon + 1 < text.size(), what,
                 " must be HOST:PORT, got '", core::printable(text), "'");
  const std::string port = text.substr(colon + 1);
  const bool digits = port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  const long p = digits ? std::stol(port) : -1;
  KRAB_CHECK_ARG(p >= (allow_zero ? 0 : 1) && p <= 65535, what, ": port '", core::printable(port),
                 "' is not a number in ", allow_zero ? "0" : "1", "..65535");
}

}  // namespace

// ---- server ---------------------------------------------------------------------------------

namespace {

struct Slot;

class RemoteParticipant : public Participant {
 public:
  RemoteParticipant(FederationServerState* state, Slot* slot, std::string name)
      : state_(state), slot_(slot), name_(std::move(name)) {}
  const std::string& id() const override { return name_; }
  FitReply fit(const FitInstruction& ins) override;
  std::vector<uint8_t> secagg(const SecAggRequest& request) override;
  bool last_request_sent() const override { return sent_; }

 private:
  wire::TaskResult run(wire::Task task);
  FederationServerState* state_;
  Slot* slot_;
  std::string name_;
  bool sent_ = false;  // written under state_->mu by run(); read by the round's thread after it
};

struct Slot {
  std::string name;
  bool ready = false;
  Clock::time_point last_seen;
  std::optional<wire::Task> pending;
  bool delivered = false;
  std::optional<wire::TaskResult> result;
  std::unique_ptr<RemoteParticipant> participant;
  std::string session;  // the Ready call that holds the token now
};

// 128 bits from the OS entropy source (std::random_device reads /dev/urandom with libstdc++).
std::string new_session() {
  std::random_device rd;
  char buf[33];
  std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return buf;
}

}  // namespace

struct FederationServerState {
  ServerTransportOptions options;              // options.tokens is emptied: only digests are kept
  std::map<std::string, TokenInfo> by_digest;  // sha256(token) -> client
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Slot> slots;  // by client name
  bool finished = false;
  uint64_t next_task = 1;
  TransportStats stats;

  std::set<std::string> refusals_shown;

  // Counts a refused call; the terminal hears of each kind of refusal once (a stranger's flood
  // of calls must not flood the log), the report keeps the last 100.
  void refuse(const std::string& why) {
    ++stats.refused_calls;
    stats.refusals.push_back(why);
    if (stats.refusals.size() > 100) stats.refusals.erase(stats.refusals.begin());
    if (refusals_shown.size() < 100 && refusals_shown.insert(why).second)
      std::fprintf(stderr, "krab: fl-server refused a call: %s\n", core::printable(why).c_str());
  }

  // The call's session must be the one the token's holder got from Ready.
  grpc::Status check_session(grpc::ServerContext* ctx, const Slot& slot) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("krab-session");
    const std::string session =
        it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
    if (session == slot.session) return grpc::Status::OK;
    refuse(str_cat("a second holder of the token of '", slot.name, "'"));
    return {grpc::StatusCode::PERMISSION_DENIED,
            str_cat("the token of '", slot.name, "' is held by another connected client")};
  }

  // The client a call's token names, or a refusal. Runs twice per call: in TokenGate, on the
  // call's headers before gRPC reads its message (a stranger cannot make the server buffer a
  // 64 MiB body), and in the handler, which needs the name.
  grpc::Status check_token(const std::multimap<grpc::string_ref, grpc::string_ref>& md,
                           const grpc::AuthContext* auth, std::string* name) {
    auto it = md.find("authorization");
    std::lock_guard<std::mutex> lock(mu);
    if (it == md.end()) {
      refuse("call without a token");
      return {grpc::StatusCode::UNAUTHENTICATED, "no token (authorization: Bearer TOKEN)"};
    }
    std::string value(it->second.data(), it->second.size());
    const std::string prefix = "Bearer ";
    if (value.compare(0, prefix.size(), prefix) == 0) value = value.substr(prefix.size());
    auto t = by_digest.find(sha256(value));
    if (t == by_digest.end()) {
      refuse("unknown token");
      return {grpc::StatusCode::UNAUTHENTICATED, "unknown token"};
    }
    if (t->second.expires != 0 && t->second.expires < std::time(nullptr)) {
      refuse(str_cat("expired token of '", t->second.client, "'"));
      return {grpc::StatusCode::UNAUTHENTICATED,
              str_cat("the token of '", t->second.client, "' expired at ", t->second.expires)};
    }
    // Under mutual TLS a token is good only with its own client's certificate: the
    // certificate's common name must be the token's client name.
    if (!options.client_ca_file.empty()) {
      std::string cn;
      if (auth != nullptr)
        for (const auto& v : auth->FindPropertyValues("x509_common_name"))
          cn.assign(v.data(), v.size());
      if (cn != t->second.client) {
        refuse(str_cat("the token of '", t->second.client, "' with the certificate of '",
                       core::printable(cn), "'"));
        return {
            grpc::StatusCode::UNAUTHENTICATED,
            str_cat("the token of '", t->second.client,
                    "' needs a client certificate whose common name is '", t->second.client, "'")};
      }
    }
    *name = t->second.client;
    return grpc::Status::OK;
  }

  grpc::Status authenticate(grpc::ServerContext* ctx, std::string* name) {
    const auto auth = ctx->auth_context();
    return check_token(ctx->client_metadata(), auth.get(), name);
  }
};

namespace {

// Checks the token on a call's headers, before its message is read (see check_token).
class TokenGate final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenGate(FederationServerState* s) : s_(s) {}
  // Blocking: gRPC runs Process on a thread of its own. Run inline (non-blocking), gRPC 1.51
  // stalled calls that carry a body larger than a flow-control window (clients' Submit timed
  // out in the end-to-end test).
  bool IsBlocking() const override { return true; }
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext* auth, OutputMetadata*,
                       OutputMetadata*) override {
    std::string name;
    return s_->check_token(md, auth, &name);
  }

 private:
  FederationServerState* s_;
};

class Service final : public wire::Federation::Service {
 public:
  explicit Service(FederationServerState* s) : s_(s) {}

  grpc::Status Hello(grpc::ServerContext* ctx, const wire::HelloRequest*,
                     wire::HelloReply* reply) override {
    std::string name;
    if (auto st = s_->authenticate(ctx, &name); !st.ok()) return st;
    reply->set_client_name(name);
    reply->set_config_yaml(s_->options.config_yaml);
    reply->set_model_signature(s_->options.model_signature);
    reply->set_model_sha256(s_->options.model_sha256);
    return grpc::Status::OK;
  }

  grpc::Status Ready(grpc::ServerContext* ctx, const wire::ReadyRequest* req,
                     wire::ReadyReply* reply) override {
    std::string name;
    if (auto st = s_->authenticate(ctx, &name); !st.ok()) return st;
    if (req->model_signature() != s_->options.model_signature) {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->refuse(str_cat("client '", name, "' has another model"));
      return {
          grpc::StatusCode::FAILED_PRECONDITION,
          str_cat("client '", name, "' built a model with another shape (", req->model_signature(),
                  ") than the server's (", s_->options.model_signature, ")")};
    }
    std::lock_guard<std::mutex> lock(s_->mu);
    Slot& slot = s_->slots[name];
    const auto now = Clock::now();
    // One token, one live client: while the holder keeps polling, a second Ready with the same
    // token is refused. A client that restarts gets the slot back once its old session has
    // gone quiet for the liveness period (it retries until then).
    if (slot.ready && !slot.session.empty() && now - slot.last_seen <= s_->options.liveness) {
      s_->refuse(str_cat("a second client with the token of '", name, "'"));
      return {
          grpc::StatusCode::ALREADY_EXISTS,
          str_cat("the token of '", name,
                  "' is in use by a connected client (a token "
                  "belongs to one client; a restarted client gets it back after ",
                  std::chrono::duration<double>(s_->options.liveness).count(), " s of silence)")};
    }
    const bool rejoin = static_cast<bool>(slot.participant);
    if (!slot.participant) {
      slot.name = name;
      slot.participant = std::make_unique<RemoteParticipant>(s_, &slot, name);
    }
    // A client that comes back (restarted) starts clean: an old task is void.
    slot.pending.reset();
    slot.result.reset();
    slot.ready = true;
    slot.last_seen = now;
    slot.session = new_session();
    reply->set_session(slot.session);
    std::fprintf(stderr, "krab: fl-server: client '%s' %s (%lld examples)\n", name.c_str(),
                 rejoin ? "joined again" : "joined", static_cast<long long>(req->num_examples()));
    s_->cv.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status GetTask(grpc::ServerContext* ctx, const wire::TaskRequest*,
                       wire::Task* task) override {
    std::string name;
    if (auto st = s_->authenticate(ctx, &name); !st.ok()) return st;
    std::unique_lock<std::mutex> lock(s_->mu);
    auto it = s_->slots.find(name);
    // NOT_FOUND tells a client whose server restarted to call Ready again.
    if (it == s_->slots.end() || !it->second.ready)
      return {grpc::StatusCode::NOT_FOUND, "unknown client session: call Ready"};
    Slot& slot = it->second;
    if (auto st = s_->check_session(ctx, slot); !st.ok()) return st;
    slot.last_seen = Clock::now();
    s_->cv.wait_for(lock, s_->options.poll_timeout, [&] {
      return s_->finished || (slot.pending && !slot.delivered) || ctx->IsCancelled();
    });
    slot.last_seen = Clock::now();
    if (slot.pending && !slot.delivered) {
      *task = *slot.pending;
      slot.delivered = true;
      s_->stats.bytes_out += static_cast<int64_t>(task->ByteSizeLong());
    } else {
      task->set_kind(s_->finished ? wire::Task::DONE : wire::Task::WAIT);
    }
    return grpc::Status::OK;
  }

  grpc::Status Submit(grpc::ServerContext* ctx, const wire::TaskResult* req,
                      wire::SubmitReply*) override {
    std::string name;
    if (auto st = s_->authenticate(ctx, &name); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(s_->mu);
    auto it = s_->slots.find(name);
    if (it == s_->slots.end() || !it->second.pending ||
        it->second.pending->task_id() != req->task_id())
      return {grpc::StatusCode::FAILED_PRECONDITION,
              str_cat("no open task ", req->task_id(), " for '", name, "' (late or duplicate)")};
    Slot& slot = it->second;
    if (auto st = s_->check_session(ctx, slot); !st.ok()) return st;
    s_->stats.bytes_in += static_cast<int64_t>(req->ByteSizeLong());
    slot.result = *req;
    slot.pending.reset();
    slot.last_seen = Clock::now();
    s_->cv.notify_all();
    return grpc::Status::OK;
  }

 private:
  FederationServerState* s_;
};

wire::TaskResult RemoteParticipant::run(wire::Task task) {
  std::unique_lock<std::mutex> lock(state_->mu);
  sent_ = false;
  // However run() ends, whether the client fetched the task (for the round's bytes_down).
  struct NoteSent {
    RemoteParticipant* self;
    ~NoteSent() { self->sent_ = self->slot_->delivered; }
  } note{this};
  const auto& o = state_->options;
  slot_->delivered = false;
  if (Clock::now() - slot_->last_seen > o.liveness)
    throw PeerLost(str_cat("client '", name_, "' has not polled for ",
                           std::chrono::duration<double>(Clock::now() - slot_->last_seen).count(),
                           " s"));
  task.set_task_id(state_->next_task++);
  slot_->pending = std::move(task);
  slot_->delivered = false;
  slot_->result.reset();
  state_->cv.notify_all();
  const auto deadline = Clock::now() + o.deadline;
  while (!slot_->result) {
    if (state_->finished) throw PeerLost("server shutting down");
    if (Clock::now() >= deadline) {
      slot_->pending.reset();
      throw Timeout(str_cat("client '", name_, "' missed the round deadline (",
                            std::chrono::duration<double>(o.deadline).count(), " s)"));
    }
    // Not yet picked up and the client stopped polling: it is gone, don't wait the deadline.
    if (!slot_->delivered && Clock::now() - slot_->last_seen > o.liveness) {
      slot_->pending.reset();
      throw PeerLost(str_cat("client '", name_, "' stopped polling"));
    }
    state_->cv.wait_for(lock, std::chrono::milliseconds(200));
  }
  wire::TaskResult r = std::move(*slot_->result);
  slot_->result.reset();
  if (!r.error().empty())
    throw Error(str_cat("client '", name_, "' failed: ", core::printable(r.error())));
  return r;
}

FitReply RemoteParticipant::fit(const FitInstruction& ins) {
  wire::Task t;
  t.set_kind(wire::Task::FIT);
  t.set_round(ins.round);
  t.set_global(tensor_bytes(ins.global));
  t.set_proximal_mu(ins.proximal_mu);
  t.set_clip_norm(ins.clip_norm);
  t.set_local_noise_std(ins.local_noise_std);
  t.set_secure(ins.secure);
  t.set_secagg_id(ins.secagg_id);
  t.set_secagg_threshold(ins.secagg_threshold);
  t.set_secagg_clients(ins.secagg_clients);
  t.set_secagg_clip(ins.secagg_clip);
  return fit_reply_from_wire(run(std::move(t)), ins.secure, str_cat("client '", name_, "'"));
}

std::vector<uint8_t> RemoteParticipant::secagg(const SecAggRequest& req) {
  wire::Task t;
  t.set_kind(wire::Task::SECAGG);
  t.set_stage(static_cast<int>(req.stage));
  t.set_weight(req.weight);
  t.set_payload(std::string(req.payload.begin(), req.payload.end()));
  wire::TaskResult r = run(std::move(t));
  return std::vector<uint8_t>(r.secagg().begin(), r.secagg().end());
}

}  // namespace

struct FederationServer::Impl {
  FederationServerState state;
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

FederationServer::FederationServer(ServerTransportOptions options)
    : impl_(std::make_unique<Impl>()) {
  // gRPC would take port 99999 modulo 2^16 (and listen somewhere unexpected): refuse it here.
  check_host_port(options.address, "federated.address", /*allow_zero=*/true);
  grpc::SslServerCredentialsOptions ssl(
      options.client_ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  quiet_grpc_logs();
  const std::string key = read_private_key(options.key_file, "federated.tls_key");
  const std::string cert = read_certificates(options.cert_file, "federated.tls_cert");
  check_key_matches(cert, key, options.cert_file, options.key_file);
  ssl.pem_key_cert_pairs.push_back({key, cert});
  if (!options.client_ca_file.empty())
    ssl.pem_root_certs = read_certificates(options.client_ca_file, "federated.tls_client_ca");
  impl_->state.options = std::move(options);
  // Keep digests only: the tokens themselves need not stay in memory.
  for (auto& [token, info] : impl_->state.options.tokens)
    impl_->state.by_digest.emplace(token_digest(token), info);
  impl_->state.options.tokens.clear();
  impl_->service = std::make_unique<Service>(&impl_->state);
  grpc::ServerBuilder builder;
  const auto& o = impl_->state.options;
  auto credentials = grpc::SslServerCredentials(ssl);
  credentials->SetAuthMetadataProcessor(std::make_shared<TokenGate>(&impl_->state));
  builder.AddListeningPort(o.address, credentials, &impl_->port);
  // Bounds on what callers can make the server hold: few streams per connection (a client needs
  // two: a poll and a submit), and a memory quota for gRPC's buffers.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 4);
  grpc::ResourceQuota quota("krab-fl-server");
  quota.Resize(static_cast<size_t>(std::max<int64_t>(int64_t{1} << 30, 4 * o.max_message_bytes)));
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(o.max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(
      static_cast<int>(std::min<int64_t>(o.max_message_bytes, INT32_MAX)));
  builder.RegisterService(impl_->service.get());
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || impl_->port == 0)
    throw Error(str_cat("federated server: cannot listen on ", o.address,
                        " (address in use, or a bad certificate/key pair)"));
}

FederationServer::~FederationServer() {
  {
    std::lock_guard<std::mutex> lock(impl_->state.mu);
    impl_->state.finished = true;
    impl_->state.cv.notify_all();
  }
  if (impl_->server)
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

int FederationServer::port() const { return impl_->port; }

std::vector<Participant*> FederationServer::available() {
  std::lock_guard<std::mutex> lock(impl_->state.mu);
  std::vector<Participant*> out;
  const auto now = Clock::now();
  for (auto& [name, slot] : impl_->state.slots)
    if (slot.ready && now - slot.last_seen <= impl_->state.options.liveness)
      out.push_back(slot.participant.get());
  return out;
}

size_t FederationServer::wait_for_clients(size_t n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->state.mu);
  auto ready = [&] {
    size_t k = 0;
    for (auto& [name, slot] : impl_->state.slots) k += slot.ready;
    return k;
  };
  impl_->state.cv.wait_for(lock, timeout, [&] { return ready() >= n; });
  return ready();
}

void FederationServer::finish(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(impl_->state.mu);
    impl_->state.finished = true;
    impl_->state.cv.notify_all();
  }
  std::this_thread::sleep_for(grace);
}

TransportStats FederationServer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->state.mu);
  return impl_->state.stats;
}

// ---- client ---------------------------------------------------------------------------------

struct FederationClient::Impl {
  ClientTransportOptions options;
  std::unique_ptr<wire::Federation::Stub> stub;
  std::string session;  // from the last Ready

  void prepare(grpc::ClientContext& ctx, std::chrono::milliseconds extra = {}) const {
    ctx.AddMetadata("authorization", "Bearer " + options.token);
    if (!session.empty()) ctx.AddMetadata("krab-session", session);
    ctx.set_deadline(std::chrono::system_clock::now() + options.timeout + extra);
  }

  [[noreturn]] void fail(const grpc::Status& st, const char* call) const {
    const std::string where = str_cat("federated server ", options.server, " (", call, ")");
    switch (st.error_code()) {
      case grpc::StatusCode::UNAUTHENTICATED:
        throw InvalidArgument(str_cat(where, ": token refused: ", st.error_message()));
      case grpc::StatusCode::ALREADY_EXISTS:
        throw TokenInUse(str_cat(where, ": ", st.error_message()));
      case grpc::StatusCode::PERMISSION_DENIED:
        throw InvalidArgument(str_cat(where, ": ", st.error_message()));
      case grpc::StatusCode::FAILED_PRECONDITION:
      case grpc::StatusCode::INVALID_ARGUMENT:
        throw InvalidArgument(str_cat(where, ": ", st.error_message()));
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        throw InvalidArgument(str_cat(where, ": message too large: ", st.error_message()));
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        throw Timeout(str_cat(where, ": no answer within the timeout"));
      case grpc::StatusCode::UNAVAILABLE:
        throw PeerLost(str_cat(where,
                               ": unreachable, or the TLS handshake failed (does the "
                               "server's certificate match the CA and the host name?): ",
                               st.error_message()));
      default:
        throw Error(str_cat(where, ": ", st.error_message()));
    }
  }

  void submit(const wire::TaskResult& req) const {
    grpc::ClientContext ctx;
    prepare(ctx);
    wire::SubmitReply r;
    grpc::Status st = stub->Submit(&ctx, req, &r);
    if (!st.ok()) fail(st, "Submit");
  }
};

FederationClient::FederationClient(ClientTransportOptions options)
    : impl_(std::make_unique<Impl>()) {
  grpc::SslCredentialsOptions ssl;
  quiet_grpc_logs();
  ssl.pem_root_certs = read_certificates(options.ca_file, "--ca");
  if (!options.cert_file.empty()) {
    ssl.pem_cert_chain = read_certificates(options.cert_file, "--cert");
    ssl.pem_private_key = read_private_key(options.key_file, "--key");
    check_key_matches(ssl.pem_cert_chain, ssl.pem_private_key, options.cert_file, options.key_file);
  }
  KRAB_CHECK_ARG(!options.token.empty(), "--token is required");
  check_host_port(options.server, "--server", /*allow_zero=*/false);
  grpc::ChannelArguments args;
  // The name the server's certificate must carry when it differs from --server's host (e.g. a
  // certificate for the machine's DNS name, reached as 127.0.0.1).
  if (!options.server_name.empty()) args.SetSslTargetNameOverride(options.server_name);
  args.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX)));
  args.SetMaxSendMessageSize(
      static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX)));
  impl_->options = std::move(options);
  impl_->stub = wire::Federation::NewStub(
      grpc::CreateCustomChannel(impl_->options.server, grpc::SslCredentials(ssl), args));
}

FederationClient::~FederationClient() = default;

FederationClient::Hello FederationClient::hello() {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  wire::HelloReply r;
  grpc::Status st = impl_->stub->Hello(&ctx, wire::HelloRequest(), &r);
  if (!st.ok()) impl_->fail(st, "Hello");
  return {r.client_name(), r.config_yaml(), r.model_signature(), r.model_sha256()};
}

void FederationClient::ready(const std::string& signature, int64_t num_examples) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  wire::ReadyRequest req;
  req.set_model_signature(signature);
  req.set_num_examples(num_examples);
  wire::ReadyReply r;
  grpc::Status st = impl_->stub->Ready(&ctx, req, &r);
  if (!st.ok()) impl_->fail(st, "Ready");
  impl_->session = r.session();
}

RemoteTask FederationClient::next_task() {
  grpc::ClientContext ctx;
  impl_->prepare(ctx, std::chrono::milliseconds(30000));
  wire::Task t;
  grpc::Status st = impl_->stub->GetTask(&ctx, wire::TaskRequest(), &t);
  RemoteTask out;
  if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
    out.kind = RemoteTask::kRejoin;
    return out;
  }
  if (!st.ok()) impl_->fail(st, "GetTask");
  return task_from_wire(t);
}

void FederationClient::submit_fit(uint64_t task_id, const FitReply& reply) {
  wire::TaskResult req;
  req.set_task_id(task_id);
  req.set_num_examples(reply.num_examples);
  req.set_mean_loss(reply.mean_loss);
  if (reply.update.defined()) req.set_update(tensor_bytes(reply.update));
  req.set_secagg(std::string(reply.secagg.begin(), reply.secagg.end()));
  impl_->submit(req);
}

void FederationClient::submit_secagg(uint64_t task_id, const std::vector<uint8_t>& message) {
  wire::TaskResult req;
  req.set_task_id(task_id);
  req.set_secagg(std::string(message.begin(), message.end()));
  impl_->submit(req);
}

void FederationClient::submit_error(uint64_t task_id, const std::string& error) {
  wire::TaskResult req;
  req.set_task_id(task_id);
  req.set_error(error.empty() ? "failed" : error);
  impl_->submit(req);
}

RemoteTask decode_task(const std::string& bytes) {
  wire::Task t;
  if (!t.ParseFromString(bytes)) throw CorruptData("the server's task does not parse");
  return task_from_wire(t);
}

FitReply decode_fit_result(const std::string& bytes, bool secure, const std::string& who) {
  wire::TaskResult r;
  if (!r.ParseFromString(bytes))
    throw CorruptData(str_cat(who, ": the task result does not parse"));
  return fit_reply_from_wire(r, secure, who);
}

}  // namespace krab::federated
