#include "train/checkpoint_reader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "core/errors.h"
#include "core/fs.h"
#include "core/printable.h"
#include "models/model.h"
#include "train/manifest.h"
#include "train/optimizer_state.h"
#include "train/shard_file.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kValue = "value";

// Copies elements [a, a + n) of fp32 record tensor `key` into dst, in place from the file; the
// shapes were checked when the file was verified, so a range outside is a krab bug.
void copy_range(const core::RecordIndex& in, const std::string& key, int64_t a, int64_t n,
                float* dst) {
  KRAB_CHECK(in.dtype(key) == at::kFloat, "checkpoint read of '", key, "': not float32");
  in.read(key, a, n, dst);
}

int64_t numel_of(const std::vector<int64_t>& shape);

// An entry that must be an fp32 tensor of `numel` elements (its header alone is read).
void check_fp32(const core::RecordIndex& in, const std::string& key, int64_t numel) {
  const auto& sizes = in.sizes(key);
  if (in.dtype(key) != at::kFloat || numel_of(sizes) != numel)
    throw CorruptData(str_cat(in.source(), ": '", key, "' is ", c10::IntArrayRef(sizes), " ",
                              in.dtype(key), ", expected ", numel, " float32 elements"));
}

// The scalar entries of a record (meta.*, optimizer types, options and step counts), read
// whole: small, and what the Record-based helpers (read_meta, read_group_options) take.
core::Record scalars_of(const core::RecordIndex& in) {
  return in.load([](const std::string&, core::RecordIndex::Kind k) {
    return k != core::RecordIndex::Kind::kTensor;
  });
}

// What every rank holds whole (buffer.NAME, rng), read whole when first asked for.
core::Record replicated_of(const core::RecordIndex& in) {
  return in.load([](const std::string& name, core::RecordIndex::Kind) {
    return name == "rng" || name.rfind("buffer.", 0) == 0;
  });
}

// The element count of a shape a file stated; -1 (which no tensor matches) where it overflows.
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

// --- state.krab --------------------------------------------------------------------------------

class FullReader : public StateReader {
 public:
  FullReader(const std::string& path, const std::string& key, const std::string& job)
      : index_(open_checkpoint_file(path, key, job)), scalars_(scalars_of(index_)) {
    source_ = path;
    meta_ = read_meta(scalars_);
    params_ = parse_param_list(meta_.signature, path, "meta.signature");
    for (size_t i = 0; i < params_.size(); ++i) position_[params_[i].name] = i;
    optimizer_type_ = scalars_.text("optimizer.type");
    if (scalars_.integer("optimizer.groups") != 1)
      throw NotSupported(str_cat("checkpoint '", path, "' has ",
                                 scalars_.integer("optimizer.groups"),
                                 " optimizer groups; it can be restored only as it was written"));
    options_ = read_group_options(scalars_, optimizer_type_, 0);
  }

  void verify(const std::string& param, int64_t, int64_t) override {
    const size_t k = index(param);
    const int64_t numel = numel_of(params_[k].shape);
    check_fp32(index_, "param." + param, numel);
    for (const std::string& f : state_fields(optimizer_type_))
      if (index_.has(key(param, f))) check_fp32(index_, key(param, f), numel);
    if (optimizer_type_ != "sgd" && index_.has(key(param, "step")) &&
        (!index_.has(key(param, "exp_avg")) || !index_.has(key(param, "exp_avg_sq"))))
      throw CorruptData(str_cat(source_, ": the Adam state of '", param, "' is incomplete"));
  }
  void read(const std::string& param, const std::string& field, int64_t a, int64_t n,
            float* dst) override {
    copy_range(index_, key(param, field), a, n, dst);
  }
  bool has_field(const std::string& param, const std::string& field, int64_t) override {
    return index_.has(key(param, field));
  }
  std::optional<int64_t> step_count(const std::string& param, int64_t) override {
    if (!scalars_.has(key(param, "step"))) return std::nullopt;
    const int64_t step = scalars_.integer(key(param, "step"));
    if (step < 0) throw CorruptData(str_cat(source_, ": ", key(param, "step"), " is ", step));
    return step;
  }
  const core::Record& replicated() override {
    if (!replicated_) replicated_ = replicated_of(index_);
    return *replicated_;
  }

 private:
  size_t index(const std::string& param) const {
    const auto it = position_.find(param);
    if (it == position_.end())
      throw InvalidArgument(str_cat("checkpoint '", source_, "' has no parameter '", param, "'"));
    return it->second;
  }
  std::string key(const std::string& param, const std::string& field) const {
    if (field == kValue) return "param." + param;
    return str_cat("optimizer.state.", index(param), ".", field);
  }

  core::RecordIndex index_;
  core::Record scalars_;
  std::optional<core::Record> replicated_;
  std::unordered_map<std::string, size_t> position_;
};

// --- manifest + shards -------------------------------------------------------------------------

class ShardedReader : public StateReader {
 public:
  ShardedReader(const std::string& dir, const std::string& key, const std::string& job)
      : dir_(dir), key_(key), job_(job) {
    source_ = manifest_path(dir);
    sharded_ = true;
    m_ = read_manifest(scalars_of(open_checkpoint_file(source_, key, job)));
    meta_ = m_.meta;
    params_ = parse_param_list(meta_.signature, source_, "meta.signature");
    optimizer_type_ = m_.optimizer_type;
    options_ = m_.optimizer_options;
  }

  void verify(const std::string& param, int64_t a, int64_t n) override {
    const auto loc = m_.layout.locate(param);
    if (!loc) {
      const auto p = std::find_if(params_.begin(), params_.end(),
                                  [&](const engine::ParamShape& s) { return s.name == param; });
      if (p == params_.end())
        throw InvalidArgument(str_cat("checkpoint '", source_, "' has no parameter '", param, "'"));
      check_fp32(shard(0).index, "param." + param, numel_of(p->shape));
      return;
    }
    if (n < 0) n = loc->numel - a;
    if (a < 0 || a + n > loc->numel)
      throw InvalidArgument(str_cat("checkpoint '", source_, "': elements [", a, ", ", a + n,
                                    ") of '", param, "' are outside its ", loc->numel));
    const int64_t s = m_.layout.shard_numel(loc->unit);
    if (n == 0 || s == 0) return;
    for (int64_t r = (loc->offset + a) / s; r <= (loc->offset + a + n - 1) / s; ++r)
      shard(static_cast<int>(r));
  }

  void read(const std::string& param, const std::string& field, int64_t a, int64_t n,
            float* dst) override {
    const auto loc = m_.layout.locate(param);
    if (!loc) {
      KRAB_CHECK(field == kValue, "a frozen parameter has no optimizer state");
      return copy_range(shard(0).index, "param." + param, a, n, dst);
    }
    KRAB_CHECK(a >= 0 && n >= 0 && a + n <= loc->numel, "read outside parameter ", param);
    const int64_t s = m_.layout.shard_numel(loc->unit);
    for (int64_t at = loc->offset + a; n > 0;) {
      const int64_t r = at / s, local = at - r * s, take = std::min(n, s - local);
      copy_range(shard(static_cast<int>(r)).index, key(loc->unit, field), local, take, dst);
      at += take;
      dst += take;
      n -= take;
    }
  }

  bool has_field(const std::string& param, const std::string& field, int64_t at) override {
    const auto loc = m_.layout.locate(param);
    if (!loc) return field == kValue;
    return shard(rank_of(*loc, at)).index.has(key(loc->unit, field));
  }

  std::optional<int64_t> step_count(const std::string& param, int64_t at) override {
    const auto loc = m_.layout.locate(param);
    if (!loc) return std::nullopt;
    const core::Record& in = shard(rank_of(*loc, at)).scalars;
    const std::string k = key(loc->unit, "step");
    if (!in.has(k)) return std::nullopt;
    const int64_t step = in.integer(k);
    if (step < 0) throw CorruptData(str_cat(in.source(), ": ", k, " is ", step));
    return step;
  }

  const core::Record& replicated() override {
    Shard& s = shard(0);
    if (!s.replicated) s.replicated = replicated_of(s.index);
    return *s.replicated;
  }

 private:
  static std::string key(int unit, const std::string& field) {
    if (field == kValue) return str_cat("unit.", unit, ".values");
    return str_cat("unit.", unit, ".optimizer.state.0.", field);
  }
  // The shard holding element `at` of the parameter at `loc` (shard 0 for an empty unit).
  int rank_of(const engine::Loc& loc, int64_t at) const {
    const int64_t s = m_.layout.shard_numel(loc.unit);
    return s == 0
               ? 0
               : static_cast<int>(std::min<int64_t>((loc.offset + at) / s, m_.layout.world() - 1));
  }
  // A shard verified and indexed; its scalars read whole, its tensors read in place.
  struct Shard {
    core::RecordIndex index;
    core::Record scalars;
    std::optional<core::Record> replicated;  // shard 0's buffers and rng, once asked for
  };
  Shard& shard(int r);
  void check_shard(const Shard& in, int r) const;

  std::string dir_, key_, job_;
  Manifest m_;
  std::map<int, Shard> shards_;
};

ShardedReader::Shard& ShardedReader::shard(int r) {
  const auto it = shards_.find(r);
  if (it != shards_.end()) return it->second;
  const std::string path = shard_path(dir_, r, m_.layout.world());
  core::RecordIndex index = read_shard_file(path, m_.shards.at(r), key_, job_);
  core::Record scalars = scalars_of(index);
  Shard s{std::move(index), std::move(scalars), std::nullopt};
  check_shard(s, r);
  return shards_.emplace(r, std::move(s)).first->second;
}

// A shard that passed its digest could still be another checkpoint's with the digest edited
// into the manifest by whoever wrote both (without a seal nothing stops that): its own entries
// must say it is shard r of this checkpoint, with one value and state tensor per unit.
void ShardedReader::check_shard(const Shard& shard, int r) const {
  const core::Record& in = shard.scalars;
  const std::string& src = in.source();
  if (in.text("meta.checkpoint_id") != m_.checkpoint_id)
    throw CorruptData(str_cat(
        "shard '", src, "' belongs to checkpoint ", core::printable(in.text("meta.checkpoint_id")),
        ", not ", m_.checkpoint_id, " of its manifest: it is from another run or step"));
  if (in.integer("meta.rank") != r || in.integer("meta.world") != m_.layout.world() ||
      in.integer("meta.step") != m_.meta.step)
    throw CorruptData(str_cat("shard '", src, "' says it is rank ", in.integer("meta.rank"), " of ",
                              in.integer("meta.world"), " at step ", in.integer("meta.step"),
                              "; the manifest expects rank ", r, " of ", m_.layout.world(),
                              " at step ", m_.meta.step));
  for (int u = 0; u < m_.layout.num_units(); ++u) {
    const int64_t s = m_.layout.shard_numel(u);
    check_fp32(shard.index, key(u, kValue), s);
    if (in.text(str_cat("unit.", u, ".optimizer.type")) != m_.optimizer_type)
      throw CorruptData(
          str_cat("shard '", src, "': unit ", u, "'s optimizer is not the manifest's"));
    for (const std::string& f : state_fields(m_.optimizer_type))
      if (shard.index.has(key(u, f))) check_fp32(shard.index, key(u, f), s);
  }
  if (r == 0) shard.index.sizes("rng");
}

}  // namespace

std::unique_ptr<StateReader> StateReader::open(const std::string& step_dir,
                                               const std::string& seal_key,
                                               const std::string& seal_job) {
  if (core::path_exists(manifest_path(step_dir)))
    return std::make_unique<ShardedReader>(step_dir, seal_key, seal_job);
  return std::make_unique<FullReader>((fs::path(step_dir) / "state.krab").string(), seal_key,
                                      seal_job);
}

}  // namespace krab::train
