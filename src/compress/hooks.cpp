#include "compress/hooks.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>

#include "core/errors.h"

namespace krab::compress {
namespace {

// A Work that waits for `deps` in order, then runs `then` once (which may issue and wait for
// further collectives). Errors from either are kept and rethrown by every later wait().
class ThenWork : public comm::Work {
 public:
  ThenWork(std::vector<comm::WorkPtr> deps, std::function<void()> then)
      : deps_(std::move(deps)), then_(std::move(then)) {}
  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    if (done_) return;
    try {
      for (auto& d : deps_)
        if (d) d->wait();
      then_();
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
      throw;
    }
    done_ = true;
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

 private:
  std::mutex mu_;
  std::vector<comm::WorkPtr> deps_;
  std::function<void()> then_;
  bool done_ = false;
  std::exception_ptr error_;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float* fptr(const at::Tensor& t) { return t.data_ptr<float>(); }
uint8_t* bptr(const at::Tensor& t) { return t.data_ptr<uint8_t>(); }

constexpr int64_t kTopkBlock = 65536;  // indices inside a block fit in uint16

}  // namespace

const std::vector<std::string>& compressor_names() {
  static const std::vector<std::string> names{"fp16", "bf16", "int8",    "onebit",
                                              "topk", "randomk", "powersgd"};
  return names;
}

void validate(const CompressionOptions& o) {
  if (o.name == "none") return;
  const auto& names = compressor_names();
  if (std::find(names.begin(), names.end(), o.name) == names.end()) {
    std::string all = "none";
    for (const auto& n : names) all += ", " + n;
    throw InvalidArgument(str_cat("comm.compression: unknown compressor '", o.name,
                                  "' (choose one of ", all, ")"));
  }
  if (o.name == "topk" || o.name == "randomk")
    KRAB_CHECK_ARG(o.ratio > 0 && o.ratio <= 1, "comm.ratio must be in (0, 1] for ", o.name,
                   ", got ", o.ratio);
  if (o.name == "powersgd")
    KRAB_CHECK_ARG(o.rank >= 1, "comm.rank must be >= 1 for powersgd, got ", o.rank);
  if (o.name == "int8" || o.name == "onebit")
    KRAB_CHECK_ARG(o.chunk == 0 || o.chunk >= 8, "comm.chunk must be 0 (the codec's default) or >= 8 for ",
                   o.name, ", got ", o.chunk);
  KRAB_CHECK_ARG(o.rotation == "none" || o.rotation == "hadamard",
                 "comm.rotation: unknown rotation '", o.rotation, "' (choose one of none, hadamard)");
  KRAB_CHECK_ARG(o.rotation == "none" || o.name == "onebit", "comm.rotation '", o.rotation,
                 "' applies to onebit only, not to comm.compression '", o.name, "'");
  if (o.rotation == "hadamard")
    KRAB_CHECK_ARG(o.chunk == 0 || (o.chunk & (o.chunk - 1)) == 0,
                   "comm.chunk must be a power of 2 for onebit with comm.rotation hadamard, got ",
                   o.chunk);
  KRAB_CHECK_ARG(o.warmup_steps >= 0, "comm.compress_warmup_steps must be >= 0, got ",
                 o.warmup_steps);
  KRAB_CHECK_ARG(o.min_numel >= 0, "comm.compress_min_numel must be >= 0, got ", o.min_numel);
  KRAB_CHECK_ARG(o.momentum >= 0 && o.momentum < 1, "comm.momentum_correction must be in [0, 1), got ",
                 o.momentum);
  KRAB_CHECK_ARG(o.clip_norm >= 0, "comm.clip_norm must be >= 0, got ", o.clip_norm);
}

std::unique_ptr<parallel::CommHook> make_compression_hook(const CompressionOptions& o) {
  validate(o);
  if (o.name == "none") return nullptr;
  if (o.name == "topk" || o.name == "randomk") return std::make_unique<SparseHook>(o);
  if (o.name == "powersgd") return std::make_unique<PowerSgdHook>(o);
  return std::make_unique<CodecHook>(o);
}

// ---------------------------------------------------------------------------------------------
// The frame.

bool CompressionHook::compressible(const parallel::ParamSlot& slot) const {
  return slot.numel() >= options_.min_numel;
}

void CompressionHook::setup(const std::vector<parallel::BucketLayout>& buckets) {
  state_.clear();
  state_.resize(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    BucketState& st = state_[b];
    for (const auto& p : buckets[b]) {
      const int64_t n = p.numel();
      const int64_t rows = p.shape.empty() ? 1 : p.shape[0];
      Slot s{p.offset, n, rows, rows > 0 ? n / rows : 0, 0};
      if (compressible(p)) {
        s.packed = st.large_numel;
        st.large_numel += n;
        st.large.push_back(s);
      } else {
        s.packed = st.small_numel;
        st.small_numel += n;
        st.small.push_back(s);
      }
    }
    st.small_buf = torch::zeros({st.small_numel});
    st.large_buf = torch::zeros({st.large_numel});
    st.residual = torch::zeros({st.large_numel});
    st.sent = torch::zeros({st.large_numel});
    if (options_.momentum > 0) {
      st.velocity_small = torch::zeros({st.small_numel});
      st.velocity_large = torch::zeros({st.large_numel});
    }
    setup_bucket(st, static_cast<int64_t>(b));
  }
}

comm::WorkPtr CompressionHook::reduce(comm::Communicator& comm, at::Tensor& bucket,
                                      int64_t bucket_index, int64_t step) {
  KRAB_CHECK(bucket_index >= 0 && bucket_index < static_cast<int64_t>(state_.size()),
             "compression hook: bucket ", bucket_index, " was not set up");
  BucketState& st = state_[bucket_index];
  torch::NoGradGuard no_grad;
  correct(st, bucket);
  if (step < options_.warmup_steps || st.large.empty())
    return comm.allreduce(bucket, comm::ReduceOp::kAvg);

  auto packed = [&](const Slot& s, const at::Tensor& buf) { return buf.narrow(0, s.packed, s.numel); };
  comm::WorkPtr small_work;
  if (!st.small.empty()) {
    for (const Slot& s : st.small) packed(s, st.small_buf).copy_(bucket.narrow(0, s.offset, s.numel));
    small_work = comm.allreduce(st.small_buf, comm::ReduceOp::kAvg);
  }
  for (const Slot& s : st.large) packed(s, st.large_buf).copy_(bucket.narrow(0, s.offset, s.numel));
  at::Tensor& x = st.large_buf;
  accumulate(st, x, bucket_index);
  at::Tensor x_in = options_.error_feedback ? x.clone() : at::Tensor();
  comm::WorkPtr work = start(comm, st, x, bucket_index, step);

  at::Tensor out = bucket;
  return std::make_shared<ThenWork>(
      std::vector<comm::WorkPtr>{small_work, work}, [this, bucket_index, out, x_in]() mutable {
        torch::NoGradGuard guard;
        BucketState& s = state_[bucket_index];
        if (x_in.defined()) at::sub_out(s.residual, x_in, s.sent);
        for (const Slot& sl : s.small)
          out.narrow(0, sl.offset, sl.numel).copy_(s.small_buf.narrow(0, sl.packed, sl.numel));
        for (const Slot& sl : s.large)
          out.narrow(0, sl.offset, sl.numel).copy_(s.large_buf.narrow(0, sl.packed, sl.numel));
      });
}

void CompressionHook::correct(BucketState& st, at::Tensor& bucket) const {
  if (options_.clip_norm > 0 && !st.large.empty()) {
    double sq = 0;
    for (const Slot& s : st.large) sq += bucket.narrow(0, s.offset, s.numel).square().sum().item<double>();
    const double norm = std::sqrt(sq);
    if (norm > options_.clip_norm)
      for (const Slot& s : st.large) bucket.narrow(0, s.offset, s.numel).mul_(options_.clip_norm / norm);
  }
  if (options_.momentum > 0) {
    auto update = [&](const std::vector<Slot>& slots, const at::Tensor& velocity) {
      for (const Slot& s : slots) {
        at::Tensor u = velocity.narrow(0, s.packed, s.numel);
        at::Tensor g = bucket.narrow(0, s.offset, s.numel);
        u.mul_(options_.momentum).add_(g);
        g.copy_(u);
      }
    };
    update(st.small, st.velocity_small);
    update(st.large, st.velocity_large);
  }
}

void CompressionHook::accumulate(BucketState& st, at::Tensor& x, int64_t) {
  if (options_.error_feedback) x.add_(st.residual);
}

// ---------------------------------------------------------------------------------------------
// fp16 / bf16 / int8 / onebit: all-to-all of encoded pieces, average, all-gather.

CodecHook::CodecHook(CompressionOptions options)
    : CompressionHook(std::move(options)), codec_(make_codec(options_.name, options_.chunk, options_.rotation == "hadamard")) {}

void CodecHook::setup_bucket(BucketState&, int64_t) { server_residual_.emplace_back(); }

comm::WorkPtr CodecHook::start(comm::Communicator& comm, BucketState& st, at::Tensor& x,
                               int64_t bucket, int64_t step) {
  const int W = comm.size();
  const int64_t n = x.numel();
  const int64_t piece = ceil_div(ceil_div(n, W), codec_->chunk()) * codec_->chunk();
  const int64_t E = codec_->encoded_bytes(piece);
  at::Tensor padded = torch::zeros({W * piece});
  padded.narrow(0, 0, n).copy_(x);
  at::Tensor enc = torch::empty({W * E}, torch::kUInt8);
  Rng rng(mix_seed(options_.seed, static_cast<uint64_t>(comm.rank()), static_cast<uint64_t>(step),
                   static_cast<uint64_t>(bucket)));
  for (int j = 0; j < W; ++j) codec_->encode(fptr(padded) + j * piece, piece, bptr(enc) + j * E, rng);
  at::Tensor own = torch::empty({W * piece});
  for (int j = 0; j < W; ++j) codec_->decode(bptr(enc) + j * E, piece, fptr(own) + j * piece);
  st.sent.copy_(own.narrow(0, 0, n));

  at::Tensor recv = torch::empty({W * E}, torch::kUInt8);
  comm::WorkPtr first = comm.alltoall(enc, recv);
  at::Tensor& server_res = server_residual_[bucket];
  if (!server_res.defined() || server_res.numel() != piece) server_res = torch::zeros({piece});
  const bool ef = options_.error_feedback;
  const uint64_t seed2 = mix_seed(options_.seed ^ 0x5EC0, static_cast<uint64_t>(comm.rank()),
                                  static_cast<uint64_t>(step), static_cast<uint64_t>(bucket));
  at::Tensor xo = x;
  return std::make_shared<ThenWork>(
      std::vector<comm::WorkPtr>{first},
      [this, &comm, W, n, piece, E, recv, padded, xo, server_res, ef, seed2]() mutable {
        torch::NoGradGuard guard;
        at::Tensor avg = torch::zeros({piece}), tmp = torch::empty({piece});
        for (int q = 0; q < W; ++q) {
          codec_->decode(bptr(recv) + q * E, piece, fptr(tmp));
          avg.add_(tmp);
        }
        avg.div_(W);
        if (ef) avg.add_(server_res);
        at::Tensor enc2 = torch::empty({E}, torch::kUInt8);
        Rng rng2(seed2);
        codec_->encode(fptr(avg), piece, bptr(enc2), rng2);
        if (ef) {
          codec_->decode(bptr(enc2), piece, fptr(tmp));
          at::sub_out(server_res, avg, tmp);
        }
        at::Tensor gathered = torch::empty({W * E}, torch::kUInt8);
        comm.allgather(enc2, gathered)->wait();
        for (int q = 0; q < W; ++q)
          codec_->decode(bptr(gathered) + q * E, piece, fptr(padded) + q * piece);
        xo.copy_(padded.narrow(0, 0, n));
      });
}

// ---------------------------------------------------------------------------------------------
// topk / randomk.

SparseHook::SparseHook(CompressionOptions options) : CompressionHook(std::move(options)) {}

comm::WorkPtr SparseHook::start(comm::Communicator& comm, BucketState& st, at::Tensor& x,
                                int64_t bucket, int64_t step) {
  return options_.name == "topk" ? start_topk(comm, st, x, bucket)
                                 : start_randomk(comm, st, x, bucket, step);
}

comm::WorkPtr SparseHook::start_topk(comm::Communicator& comm, BucketState& st, at::Tensor& x,
                                     int64_t bucket) {
  const int W = comm.size();
  const int64_t n = x.numel();
  // Fixed layout: per block [fp32 scale][k x uint16 index][k x fp16 value / scale].
  struct Block {
    int64_t start, len, k, at;
  };
  std::vector<Block> blocks;
  int64_t bytes = 0;
  for (int64_t s = 0; s < n; s += kTopkBlock) {
    const int64_t len = std::min(kTopkBlock, n - s);
    const int64_t k =
        std::min(len, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(options_.ratio * len))));
    blocks.push_back({s, len, k, bytes});
    bytes += 4 + 4 * k;
  }
  at::Tensor payload = torch::empty({bytes}, torch::kUInt8);
  st.sent.zero_();
  at::Tensor& u = st.velocity_large;
  for (const Block& b : blocks) {
    at::Tensor xb = x.narrow(0, b.start, b.len);
    at::Tensor idx = std::get<1>(xb.abs().topk(b.k, 0, /*largest=*/true, /*sorted=*/false));
    idx = std::get<0>(idx.sort());
    at::Tensor vals = xb.index_select(0, idx).contiguous();
    const float scale = vals.abs().max().item<float>();
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    uint8_t* p = bptr(payload) + b.at;
    std::memcpy(p, &scale, 4);
    const int64_t* ip = idx.data_ptr<int64_t>();
    const float* vp = fptr(vals);
    float* sent = fptr(st.sent) + b.start;
    for (int64_t i = 0; i < b.k; ++i) {
      const auto index = static_cast<uint16_t>(ip[i]);
      const c10::Half h(vp[i] * inv);
      std::memcpy(p + 4 + 2 * i, &index, 2);
      std::memcpy(p + 4 + 2 * b.k + 2 * i, &h, 2);
      sent[ip[i]] = static_cast<float>(h) * scale;
    }
    if (u.defined()) u.narrow(0, b.start, b.len).index_fill_(0, idx, 0.0f);  // factor masking
  }
  at::Tensor gathered = torch::empty({W * bytes}, torch::kUInt8);
  comm::WorkPtr first = comm.allgather(payload, gathered);
  at::Tensor xo = x;
  return std::make_shared<ThenWork>(
      std::vector<comm::WorkPtr>{first}, [W, bytes, blocks, gathered, xo]() mutable {
        xo.zero_();
        float* out = fptr(xo);
        for (int q = 0; q < W; ++q)
          for (const Block& b : blocks) {
            const uint8_t* p = bptr(gathered) + q * bytes + b.at;
            float scale;
            std::memcpy(&scale, p, 4);
            for (int64_t i = 0; i < b.k; ++i) {
              uint16_t index;
              c10::Half h;
              std::memcpy(&index, p + 4 + 2 * i, 2);
              std::memcpy(&h, p + 4 + 2 * b.k + 2 * i, 2);
              out[b.start + index] += static_cast<float>(h) * scale;
            }
          }
        xo.div_(W);
      });
}

comm::WorkPtr SparseHook::start_randomk(comm::Communicator& comm, BucketState& st, at::Tensor& x,
                                        int64_t bucket, int64_t step) {
  const int64_t n = x.numel();
  const int64_t k =
      std::min(n, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(options_.ratio * n))));
  // Floyd's sampling of k distinct positions; same seed on every rank, same positions. A
  // bitmap marks them (a hash set cost more than the backward pass at ratio 0.5), and reading
  // it back gives them in order.
  Rng rng(mix_seed(options_.seed ^ 0x7A2D, static_cast<uint64_t>(step),
                   static_cast<uint64_t>(bucket)));
  std::vector<uint8_t> chosen(static_cast<size_t>(n), 0);
  for (int64_t j = n - k; j < n; ++j) {
    const auto t = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(j + 1));
    chosen[static_cast<size_t>(chosen[t] ? j : t)] = 1;
  }
  at::Tensor idx = torch::empty({k}, torch::kLong);
  int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t i = 0, m = 0; i < n; ++i)
    if (chosen[static_cast<size_t>(i)]) ip[m++] = i;
  at::Tensor vals = x.index_select(0, idx).contiguous();
  st.sent.zero_().index_copy_(0, idx, vals);
  if (st.velocity_large.defined()) st.velocity_large.index_fill_(0, idx, 0.0f);
  comm::WorkPtr first = comm.allreduce(vals, comm::ReduceOp::kAvg);
  at::Tensor xo = x;
  return std::make_shared<ThenWork>(std::vector<comm::WorkPtr>{first}, [xo, idx, vals]() mutable {
    xo.zero_().index_copy_(0, idx, vals);
  });
}

// ---------------------------------------------------------------------------------------------
// PowerSGD.

bool PowerSgdHook::compressible(const parallel::ParamSlot& slot) const {
  if (slot.shape.size() < 2 || slot.numel() < options_.min_numel) return false;
  const int64_t rows = slot.shape[0], cols = slot.numel() / rows;
  return (rows + cols) * options_.rank < rows * cols;
}

void PowerSgdHook::setup_bucket(BucketState& st, int64_t bucket) {
  std::vector<at::Tensor> qs;
  for (size_t i = 0; i < st.large.size(); ++i) {
    const Slot& s = st.large[i];
    auto gen = at::detail::createCPUGenerator(
        mix_seed(options_.seed ^ 0x9057, static_cast<uint64_t>(bucket), i));
    qs.push_back(at::randn({s.cols, options_.rank}, gen));
  }
  q_.push_back(std::move(qs));
}

comm::WorkPtr PowerSgdHook::start(comm::Communicator& comm, BucketState& st, at::Tensor& x,
                                  int64_t bucket, int64_t) {
  const int64_t r = options_.rank;
  int64_t p_numel = 0, q_numel = 0;
  for (const Slot& s : st.large) {
    p_numel += s.rows * r;
    q_numel += s.cols * r;
  }
  at::Tensor p_flat = torch::empty({p_numel});
  int64_t at = 0;
  std::vector<at::Tensor> ms;
  for (size_t i = 0; i < st.large.size(); ++i) {
    const Slot& s = st.large[i];
    ms.push_back(x.narrow(0, s.packed, s.numel).view({s.rows, s.cols}));
    at::Tensor p = p_flat.narrow(0, at, s.rows * r).view({s.rows, r});
    at::mm_out(p, ms.back(), q_[bucket][i]);
    at += s.rows * r;
  }
  comm::WorkPtr first = comm.allreduce(p_flat, comm::ReduceOp::kAvg);
  at::Tensor sent = st.sent;
  const std::vector<Slot> slots = st.large;
  return std::make_shared<ThenWork>(
      std::vector<comm::WorkPtr>{first},
      [this, &comm, bucket, r, q_numel, p_flat, ms, sent, slots]() mutable {
        torch::NoGradGuard guard;
        std::vector<at::Tensor> ps;
        at::Tensor q_flat = torch::empty({q_numel});
        int64_t pat = 0, qat = 0;
        for (size_t i = 0; i < slots.size(); ++i) {
          const Slot& s = slots[i];
          at::Tensor p = p_flat.narrow(0, pat, s.rows * r).view({s.rows, r});
          ps.push_back(std::get<0>(at::linalg_qr(p, "reduced")));
          at::Tensor q = q_flat.narrow(0, qat, s.cols * r).view({s.cols, r});
          at::mm_out(q, ms[i].t(), ps.back());
          pat += s.rows * r;
          qat += s.cols * r;
        }
        at::Tensor q_local = q_flat.clone();
        comm.allreduce(q_flat, comm::ReduceOp::kAvg)->wait();
        qat = 0;
        for (size_t i = 0; i < slots.size(); ++i) {
          const Slot& s = slots[i];
          at::Tensor q_avg = q_flat.narrow(0, qat, s.cols * r).view({s.cols, r});
          at::Tensor q_own = q_local.narrow(0, qat, s.cols * r).view({s.cols, r});
          at::Tensor own = sent.narrow(0, s.packed, s.numel).view({s.rows, s.cols});
          at::mm_out(own, ps[i], q_own.t());
          at::mm_out(ms[i], ps[i], q_avg.t());  // the averaged approximation, into x
          q_[bucket][i].copy_(q_avg);
          qat += s.cols * r;
        }
      });
}

}  // namespace krab::compress
