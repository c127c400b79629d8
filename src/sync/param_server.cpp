// The only file that includes gRPC and the generated protocol (STYLE.md: transports stay in
// their own translation unit; gRPC's headers cost seconds per include).
#include "sync/param_server.h"

#include <ATen/ops/empty.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/errors.h"
#include "sync/ps.grpc.pb.h"

namespace krab::sync {
namespace {

// Below protobuf's 2 GiB hard limit, with room for the framing.
constexpr int64_t kMaxShardBytes = (int64_t{1} << 31) - (int64_t{1} << 20);

// A message may be one shard's floats plus this much (framing, a worker's report).
constexpr int64_t kMessageMargin = int64_t{1} << 20;
constexpr char kSecretKey[] = "krab-job-secret";
constexpr char kNonFinite[] = "the gradient has a NaN or an infinity";

int message_limit(int64_t floats) {
  return static_cast<int>(std::min<int64_t>(INT_MAX, floats * 4 + kMessageMargin));
}

grpc::ChannelArguments channel_args(int max_receive = INT_MAX) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_receive);
  args.SetMaxSendMessageSize(INT_MAX);
  return args;
}

// Same time for every `given` of the right length, wherever it differs (the length of the
// secret is no secret: the launcher makes 64 hex digits).
bool same_secret(const std::string& expected, grpc::string_ref given) {
  if (given.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < expected.size(); ++i)
    diff |= static_cast<unsigned char>(expected[i] ^ given.data()[i]);
  return diff == 0;
}

WorkerSummary from_wire(const wire::WorkerReport& r) {
  WorkerSummary s;
  s.steps = r.steps();
  s.seconds = r.seconds();
  s.wait_seconds = r.wait_seconds();
  s.final_loss = r.final_loss();
  for (const auto& e : r.evals())
    s.evals.push_back({e.step(), e.seconds(), e.test_accuracy(), e.test_loss()});
  return s;
}

void to_wire(const WorkerSummary& s, wire::WorkerReport* r) {
  r->set_steps(s.steps);
  r->set_seconds(s.seconds);
  r->set_wait_seconds(s.wait_seconds);
  r->set_final_loss(s.final_loss);
  for (const auto& e : s.evals) {
    auto* w = r->add_evals();
    w->set_step(e.step);
    w->set_seconds(e.seconds);
    w->set_test_accuracy(e.test_accuracy);
    w->set_test_loss(e.test_loss);
  }
}

// The Step handler's work on a request as gRPC parsed it (Service::Step, serve_step()). The
// gradient's length is the one thing only the bytes can tell; the shard checks the rest.
// Throws InvalidArgument for a request the shard refuses, and what ShardState::step throws.
// Returns the record the answer depends on (ShardState::Reply::seq).
int64_t run_step(ShardState& state, const wire::StepRequest& req, wire::StepReply* reply,
                 const std::function<bool()>& cancelled) {
  if (req.grad().size() % sizeof(float) != 0)
    throw InvalidArgument(
        str_cat("gradient of ", req.grad().size(), " bytes is not a float32 array"));
  // One NaN would make every parameter of the shard NaN at its next update, for every worker.
  const size_t n = req.grad().size() / sizeof(float);
  const float* g = reinterpret_cast<const float*>(req.grad().data());
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(g[i])) throw InvalidArgument(kNonFinite);
  WorkerSummary summary;
  ShardState::Step s;
  s.worker = req.worker();
  s.clock = req.clock();
  if (!req.grad().empty()) {
    // Protobuf strings are heap blocks (16-byte aligned), so this float view is aligned.
    s.grad = reinterpret_cast<const float*>(req.grad().data());
    s.grad_numel = static_cast<int64_t>(req.grad().size() / sizeof(float));
  }
  s.base_version = req.base_version();
  s.leave = req.leave();
  if (req.has_report()) {
    summary = from_wire(req.report());
    s.summary = &summary;
  }
  ShardState::Reply r = state.step(s, cancelled);
  reply->set_version(r.version);
  reply->set_values(std::move(r.values));
  reply->set_stop(r.stop);
  reply->set_ticket(r.ticket);
  return r.seq;
}

void to_wire(const Record& r, wire::MirrorRecord* w) {
  w->set_seq(r.seq);
  w->set_kind(static_cast<int>(r.kind));
  w->set_worker(r.worker);
  w->set_clock(r.clock);
  w->set_base_version(r.base_version);
  w->set_grad(r.grad);
  for (int v : r.workers) w->add_workers(v);
  w->set_version(r.version);
}

Record from_wire(const wire::MirrorRecord& w) {
  if (w.kind() < 0 || w.kind() > static_cast<int>(Record::Kind::kRevive))
    throw CorruptData(str_cat("mirror: record ", w.seq(), " of unknown kind ", w.kind()));
  if (w.grad().size() % sizeof(float) != 0)
    throw CorruptData(str_cat("mirror: record ", w.seq(), "'s gradient is not float32"));
  Record r;
  r.seq = w.seq();
  r.kind = static_cast<Record::Kind>(w.kind());
  r.worker = w.worker();
  r.clock = w.clock();
  r.base_version = w.base_version();
  r.grad = w.grad();
  r.workers.assign(w.workers().begin(), w.workers().end());
  r.version = w.version();
  return r;
}

// The chief's view of a Finish reply (finish_shard(), decode_finish_reply()).
FinalShard final_shard_from_wire(const wire::FinishReply& reply, const std::string& who) {
  const auto& v = reply.values();
  if (v.size() % sizeof(float) != 0)
    throw CorruptData(str_cat(who, " sent a shard of ", v.size(), " bytes, not float32 values"));
  FinalShard f;
  f.values = at::empty({static_cast<int64_t>(v.size() / 4)}, at::kFloat);
  if (!v.empty()) std::memcpy(f.values.data_ptr(), v.data(), v.size());
  f.bytes_received = reply.bytes_received();
  f.bytes_sent = reply.bytes_sent();
  f.version = reply.version();
  f.promoted = reply.promoted();
  return f;
}

// A failed call, as the exception the CLI maps to an exit code, naming the server.
[[noreturn]] void throw_status(const grpc::Status& st, int shard, const std::string& address,
                               std::chrono::milliseconds timeout) {
  const std::string who = shard >= 0 ? str_cat("parameter server ", shard, " (", address, ")")
                                     : str_cat("parameter server ", address);
  switch (st.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::UNAUTHENTICATED:
      throw InvalidArgument(str_cat(who, " refused the call: ", st.error_message()));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      throw Timeout(
          str_cat(who, " did not answer within ", timeout.count() / 1000.0, " s (comm.timeout_s)"));
    case grpc::StatusCode::UNAVAILABLE:
      throw PeerLost(str_cat(who, " is unreachable: ", st.error_message()));
    default:
      throw Error(str_cat(who, ": ", st.error_message()));
  }
}

// The replies' messages name no state of the shard or of other workers (an outsider read
// worker clocks from them once); what was wrong goes to this server's stderr.
class Service final : public wire::ParameterServer::Service {
 public:
  Service(std::shared_ptr<ShardState> state, std::string secret,
          std::shared_ptr<Replicator> replicator, std::chrono::milliseconds ack_timeout)
      : state_(std::move(state)),
        secret_(std::move(secret)),
        replicator_(std::move(replicator)),
        ack_timeout_(ack_timeout) {}

  grpc::Status Step(grpc::ServerContext* ctx, const wire::StepRequest* req,
                    wire::StepReply* reply) override {
    if (!authorised(*ctx, "Step")) return unauthenticated();
    if (replicator_ && replicator_->deposed()) return deposed();
    announce_promotion(*ctx);
    received_ += req->ByteSizeLong();
    try {
      const int64_t seq = run_step(*state_, *req, reply, [ctx] { return ctx->IsCancelled(); });
      // The answer is an acknowledgement: the mirror must have what it acknowledges.
      if (replicator_) switch (wait_mirrored(*ctx, seq)) {
          case Replicator::Outcome::kDeposed:
            return deposed();
          case Replicator::Outcome::kTimeout:
            return {grpc::StatusCode::DEADLINE_EXCEEDED, "the shard's mirror did not answer"};
          default:
            break;  // acked, or the mirror is lost and the shard goes on alone
        }
    } catch (const InvalidArgument& e) {
      log(*ctx, "Step", e.what());
      return {grpc::StatusCode::INVALID_ARGUMENT,
              std::string(e.what()) == kNonFinite
                  ? kNonFinite
                  : "the shard refused the request (the parameter server's log says why)"};
    } catch (const std::exception& e) {
      log(*ctx, "Step", e.what());
      return {grpc::StatusCode::CANCELLED, "the call was cancelled"};
    }
    sent_ += reply->ByteSizeLong();
    return grpc::Status::OK;
  }

  grpc::Status Finish(grpc::ServerContext* ctx, const wire::FinishRequest*,
                      wire::FinishReply* reply) override {
    if (!authorised(*ctx, "Finish")) return unauthenticated();
    announce_promotion(*ctx);
    while (!state_->wait_done(std::chrono::milliseconds(200)))
      if (ctx->IsCancelled()) return {grpc::StatusCode::CANCELLED, "chief went away"};
    at::Tensor v = state_->values();
    reply->set_values(std::string(static_cast<const char*>(v.data_ptr()), v.numel() * 4));
    const ShardStats st = state_->stats();
    reply->set_version(st.version);
    reply->set_promoted(st.promoted);
    // The counters as they stand; the Finish reply itself is not in them.
    reply->set_bytes_received(received_.load());
    reply->set_bytes_sent(sent_.load());
    {
      std::lock_guard<std::mutex> lock(mu_);
      finish_answered_ = true;
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Mirror(grpc::ServerContext* ctx, const wire::MirrorRequest* req,
                      wire::MirrorReply* reply) override {
    if (!authorised(*ctx, "Mirror")) return unauthenticated();
    try {
      for (const auto& w : req->records())
        if (!state_->replay(from_wire(w)))
          return {grpc::StatusCode::FAILED_PRECONDITION,
                  "this server answers for the shard now (or holds no mirror)"};
    } catch (const std::exception& e) {
      log(*ctx, "Mirror", e.what());
      return {grpc::StatusCode::DATA_LOSS, "the mirror could not apply the records"};
    }
    reply->set_applied_seq(state_->stats().replayed_seq);
    return grpc::Status::OK;
  }

  grpc::Status Snapshot(grpc::ServerContext* ctx, const wire::SnapshotRequest*,
                        wire::SnapshotReply* reply) override {
    if (!authorised(*ctx, "Snapshot")) return unauthenticated();
    const ShardStats st = state_->stats();
    at::Tensor v = state_->values();
    reply->set_values(std::string(static_cast<const char*>(v.data_ptr()), v.numel() * 4));
    reply->set_version(st.version);
    reply->set_pushes(st.pushes);
    for (const auto& w : st.workers) reply->add_clocks(w.clock);
    reply->set_replayed_seq(st.replayed_seq);
    reply->set_mirror(state_->mirror());
    reply->set_promoted(st.promoted);
    return grpc::Status::OK;
  }

  bool wait_finish(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return finish_answered_; });
  }

  std::atomic<uint64_t> received_{0}, sent_{0};

 private:
  bool authorised(const grpc::ServerContext& ctx, const char* call) {
    if (secret_.empty()) return true;
    const auto& md = ctx.client_metadata();
    const auto it = md.find(kSecretKey);
    if (it != md.end() && same_secret(secret_, it->second)) return true;
    log(ctx, call, "the job secret is missing or wrong");
    return false;
  }

  // In slices, so that a call the server cancels (shutting down) does not hold it up.
  Replicator::Outcome wait_mirrored(const grpc::ServerContext& ctx, int64_t seq) {
    const auto deadline = std::chrono::steady_clock::now() + ack_timeout_;
    for (;;) {
      const auto o = replicator_->wait_acked(seq, std::chrono::milliseconds(200));
      if (o != Replicator::Outcome::kTimeout || ctx.IsCancelled() ||
          std::chrono::steady_clock::now() >= deadline)
        return o;
    }
  }

  static grpc::Status deposed() {
    return {grpc::StatusCode::UNAVAILABLE, "this server no longer answers for its shard"};
  }

  // A mirror's first worker call or Finish: its primary is gone (the caller could not reach
  // it), so this one answers for the shard from now on.
  void announce_promotion(const grpc::ServerContext& ctx) {
    if (!state_->mirror() || announced_.exchange(true)) return;
    state_->promote();
    std::fprintf(stderr,
                 "krab: parameter server: a mirror takes over its shard (first call from %s)\n",
                 ctx.peer().c_str());
  }

  static grpc::Status unauthenticated() {
    return {grpc::StatusCode::UNAUTHENTICATED, "the job secret is missing or wrong"};
  }

  static void log(const grpc::ServerContext& ctx, const char* call, const std::string& why) {
    std::fprintf(stderr, "krab: parameter server: refused a %s call from %s: %s\n", call,
                 ctx.peer().c_str(), why.c_str());
  }

  std::shared_ptr<ShardState> state_;
  const std::string secret_;
  const std::shared_ptr<Replicator> replicator_;
  const std::chrono::milliseconds ack_timeout_;
  std::atomic<bool> announced_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool finish_answered_ = false;
};

}  // namespace

void check_shard_fits(int64_t numel, int servers) {
  KRAB_CHECK_ARG(servers >= 1, "sync.servers must be >= 1 for sync.mode 'async', got ", servers);
  const int64_t largest =
      shard_range(numel, servers - 1, servers).numel * 4;  // the last is largest
  KRAB_CHECK_ARG(largest <= kMaxShardBytes, "sync.servers: a shard of ", largest,
                 " bytes does not fit one message (2 GiB); use more servers");
}

struct ParamServer::Impl {
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

ParamServer::ParamServer(std::shared_ptr<ShardState> state, int port, Access access,
                         std::shared_ptr<Replicator> replicator,
                         std::chrono::milliseconds ack_timeout)
    : impl_(new Impl) {
  const int max_receive = message_limit(state->numel());
  impl_->service = std::make_unique<Service>(std::move(state), std::move(access.secret),
                                             std::move(replicator), ack_timeout);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second server could share a taken port silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_receive);
  builder.SetMaxSendMessageSize(INT_MAX);
  const std::string host =
      access.host.find(':') != std::string::npos ? "[" + access.host + "]" : access.host;
  builder.AddListeningPort(str_cat(host, ":", port), grpc::InsecureServerCredentials(),
                           &impl_->port);
  builder.RegisterService(impl_->service.get());
  impl_->server = builder.BuildAndStart();
  KRAB_CHECK_ARG(impl_->server && impl_->port > 0, "parameter server: cannot listen on port ", port,
                 " (in use?)");
}

ParamServer::~ParamServer() {
  if (impl_->server)
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

int ParamServer::port() const { return impl_->port; }

bool ParamServer::wait_finish_answered(std::chrono::milliseconds timeout) {
  return impl_->service->wait_finish(timeout);
}

uint64_t ParamServer::bytes_received() const { return impl_->service->received_.load(); }
uint64_t ParamServer::bytes_sent() const { return impl_->service->sent_.load(); }

namespace {

// A dead server's calls fail UNAVAILABLE at once (connection refused or reset), and so do a
// deposed primary's; a server shutting down cancels the calls it holds (CANCELLED: this
// client never cancels its own). A slow one's run into their deadline and are not retried.
bool fail_over_on(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == grpc::StatusCode::CANCELLED;
}

}  // namespace

struct PsClient::Impl {
  std::vector<std::string> addresses, mirrors;
  std::vector<std::unique_ptr<wire::ParameterServer::Stub>> stubs;
  std::vector<bool> failed_over;
  std::vector<ShardRange> ranges;
  std::vector<int64_t> versions;
  std::chrono::milliseconds timeout;
  int64_t total = 0;
  std::string secret;

  // Shard i's primary failed the call with `status`: with a mirror not yet used, sends the same
  // request (clock and gradient included) to it and stays there; the mirror either has this
  // push (the primary forwarded it) and answers it as a retry, or applies it now
  // (sync/shard.h). Returns the status to judge the call by; adds the bytes sent again.
  grpc::Status fail_over(int i, int worker, grpc::Status status, const wire::StepRequest& req,
                         wire::StepReply& reply, uint64_t& bytes_sent) {
    if (status.ok() || mirrors.empty() || failed_over[i] || !fail_over_on(status)) return status;
    std::fprintf(
        stderr,
        "krab: worker %d: parameter server %d (%s) failed (%s); going on with its mirror %s\n",
        worker, i, addresses[i].c_str(), status.error_message().c_str(), mirrors[i].c_str());
    failed_over[i] = true;
    addresses[i] = mirrors[i];
    stubs[i] = wire::ParameterServer::NewStub(
        grpc::CreateCustomChannel(mirrors[i], grpc::InsecureChannelCredentials(),
                                  channel_args(message_limit(ranges[i].numel))));
    grpc::ClientContext retry;
    retry.set_deadline(std::chrono::system_clock::now() + timeout);
    if (!secret.empty()) retry.AddMetadata(kSecretKey, secret);
    bytes_sent += req.ByteSizeLong();
    reply.Clear();
    return stubs[i]->Step(&retry, req, &reply);
  }
};

PsClient::PsClient(std::vector<std::string> addresses, int worker, int64_t total_numel,
                   std::chrono::milliseconds timeout, std::string secret,
                   std::vector<std::string> mirrors)
    : impl_(new Impl), worker_(worker) {
  KRAB_CHECK_ARG(!addresses.empty(), "no parameter servers to talk to");
  KRAB_CHECK_ARG(mirrors.empty() || mirrors.size() == addresses.size(), mirrors.size(),
                 " mirror addresses for ", addresses.size(), " shards");
  const int n = static_cast<int>(addresses.size());
  impl_->total = total_numel;
  impl_->timeout = timeout;
  impl_->secret = std::move(secret);
  for (int i = 0; i < n; ++i) {
    impl_->ranges.push_back(shard_range(total_numel, i, n));
    impl_->stubs.push_back(wire::ParameterServer::NewStub(
        grpc::CreateCustomChannel(addresses[i], grpc::InsecureChannelCredentials(),
                                  channel_args(message_limit(impl_->ranges[i].numel)))));
  }
  impl_->versions.assign(n, 0);
  impl_->failed_over.assign(n, false);
  impl_->addresses = std::move(addresses);
  impl_->mirrors = std::move(mirrors);
}

PsClient::~PsClient() = default;

int PsClient::failovers() const {
  return static_cast<int>(std::count(impl_->failed_over.begin(), impl_->failed_over.end(), true));
}

PullResult PsClient::pull(at::Tensor& params) { return call_all(nullptr, false, nullptr, &params); }

PullResult PsClient::push_pull(const at::Tensor& grad, at::Tensor& params) {
  return call_all(&grad, false, nullptr, &params);
}

void PsClient::push_and_leave(const at::Tensor& grad, const WorkerSummary& summary) {
  call_all(&grad, true, &summary, nullptr);
}

void PsClient::leave(const WorkerSummary& summary) { call_all(nullptr, true, &summary, nullptr); }

// One Step per shard, all in flight at once (gRPC's callback API), then wait for all.
PullResult PsClient::call_all(const at::Tensor* grad, bool leave, const WorkerSummary* summary,
                              at::Tensor* params) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = static_cast<int>(impl_->stubs.size());
  if (grad) {
    KRAB_CHECK(
        grad->numel() == impl_->total && grad->is_contiguous() && grad->scalar_type() == at::kFloat,
        "gradient must be ", impl_->total, " contiguous floats");
    ++clock_;
  }
  if (params)
    KRAB_CHECK(params->numel() == impl_->total && params->is_contiguous() &&
                   params->scalar_type() == at::kFloat,
               "parameters must be ", impl_->total, " contiguous floats");
  std::vector<wire::StepRequest> reqs(n);
  std::vector<wire::StepReply> replies(n);
  std::vector<grpc::ClientContext> ctxs(n);
  std::vector<grpc::Status> statuses(n);
  std::mutex mu;
  std::condition_variable cv;
  int pending = n;
  for (int i = 0; i < n; ++i) {
    auto& q = reqs[i];
    q.set_worker(worker_);
    q.set_clock(clock_);
    q.set_base_version(impl_->versions[i]);
    q.set_leave(leave);
    if (grad)
      q.set_grad(static_cast<const char*>(grad->data_ptr()) + impl_->ranges[i].offset * 4,
                 impl_->ranges[i].numel * 4);
    if (summary && i == 0) to_wire(*summary, q.mutable_report());
    bytes_sent_ += q.ByteSizeLong();
    ctxs[i].set_deadline(std::chrono::system_clock::now() + impl_->timeout);
    if (!impl_->secret.empty()) ctxs[i].AddMetadata(kSecretKey, impl_->secret);
    impl_->stubs[i]->async()->Step(&ctxs[i], &reqs[i], &replies[i], [&, i](grpc::Status st) {
      std::lock_guard<std::mutex> lock(mu);
      statuses[i] = std::move(st);
      if (--pending == 0) cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
  }
  for (int i = 0; i < n; ++i)
    statuses[i] =
        impl_->fail_over(i, worker_, std::move(statuses[i]), reqs[i], replies[i], bytes_sent_);
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int i = 0; i < n; ++i)
    if (!statuses[i].ok()) throw_status(statuses[i], i, impl_->addresses[i], impl_->timeout);
  PullResult result;
  result.ticket = replies[0].ticket();
  for (int i = 0; i < n; ++i) {
    bytes_received_ += replies[i].ByteSizeLong();
    impl_->versions[i] = replies[i].version();
    result.stop = result.stop || replies[i].stop();
  }
  // One shard saying stop is enough (the others are about to): leave.
  if (result.stop || !params) return result;
  for (int i = 0; i < n; ++i) {
    const auto& v = replies[i].values();
    KRAB_CHECK(static_cast<int64_t>(v.size()) == impl_->ranges[i].numel * 4, "parameter server ", i,
               " sent ", v.size(), " bytes, expected ", impl_->ranges[i].numel * 4);
    std::memcpy(static_cast<char*>(params->data_ptr()) + impl_->ranges[i].offset * 4, v.data(),
                v.size());
  }
  return result;
}

FinalShard finish_shard(const std::string& address, std::chrono::milliseconds timeout,
                        const std::string& secret, const std::string& mirror) {
  if (!mirror.empty()) {
    try {
      return finish_shard(address, timeout, secret);
    } catch (const PeerLost& e) {
      std::fprintf(stderr, "krab: %s; collecting the shard from its mirror %s\n", e.what(),
                   mirror.c_str());
      return finish_shard(mirror, timeout, secret);
    }
  }
  auto stub = wire::ParameterServer::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), channel_args()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  if (!secret.empty()) ctx.AddMetadata(kSecretKey, secret);
  wire::FinishRequest req;
  wire::FinishReply reply;
  grpc::Status st = stub->Finish(&ctx, req, &reply);
  if (!st.ok()) throw_status(st, -1, address, timeout);
  return final_shard_from_wire(reply, str_cat("parameter server ", address));
}

Replicator::Send mirror_sender(const std::string& address, std::chrono::milliseconds timeout,
                               const std::string& secret) {
  std::shared_ptr<wire::ParameterServer::Stub> stub = wire::ParameterServer::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), channel_args()));
  return [stub, address, timeout, secret](const std::vector<Record>& batch) {
    wire::MirrorRequest req;
    for (const Record& r : batch) to_wire(r, req.add_records());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    if (!secret.empty()) ctx.AddMetadata(kSecretKey, secret);
    wire::MirrorReply reply;
    const grpc::Status st = stub->Mirror(&ctx, req, &reply);
    if (st.ok() && reply.applied_seq() >= batch.back().seq) return Replicator::SendResult::kApplied;
    if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
      return Replicator::SendResult::kRefused;
    std::fprintf(stderr, "krab: parameter server: the mirror at %s: %s\n", address.c_str(),
                 st.ok() ? "applied fewer records than sent" : st.error_message().c_str());
    return Replicator::SendResult::kUnreachable;
  };
}

ShardSnapshot snapshot_shard(const std::string& address, std::chrono::milliseconds timeout,
                             const std::string& secret) {
  auto stub = wire::ParameterServer::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), channel_args()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  if (!secret.empty()) ctx.AddMetadata(kSecretKey, secret);
  wire::SnapshotRequest req;
  wire::SnapshotReply reply;
  const grpc::Status st = stub->Snapshot(&ctx, req, &reply);
  if (!st.ok()) throw_status(st, -1, address, timeout);
  const auto& v = reply.values();
  if (v.size() % sizeof(float) != 0)
    throw CorruptData(str_cat("parameter server ", address, " sent a snapshot of ", v.size(),
                              " bytes, not float32 values"));
  ShardSnapshot out;
  out.values = at::empty({static_cast<int64_t>(v.size() / 4)}, at::kFloat);
  if (!v.empty()) std::memcpy(out.values.data_ptr(), v.data(), v.size());
  out.version = reply.version();
  out.pushes = reply.pushes();
  out.replayed_seq = reply.replayed_seq();
  out.clocks.assign(reply.clocks().begin(), reply.clocks().end());
  out.mirror = reply.mirror();
  out.promoted = reply.promoted();
  return out;
}

std::string serve_step(ShardState& state, const std::string& request,
                       const std::function<bool()>& cancelled) {
  wire::StepRequest req;
  if (!req.ParseFromString(request))
    throw CorruptData("parameter server: a Step request does not parse");
  wire::StepReply reply;
  run_step(state, req, &reply, cancelled);
  return reply.SerializeAsString();
}

FinalShard decode_finish_reply(const std::string& bytes, const std::string& who) {
  wire::FinishReply reply;
  if (!reply.ParseFromString(bytes))
    throw CorruptData(str_cat(who, ": the Finish reply does not parse"));
  return final_shard_from_wire(reply, who);
}

}  // namespace krab::sync
