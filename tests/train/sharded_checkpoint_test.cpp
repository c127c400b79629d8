// Sharded checkpoints (train/sharded_checkpoint.h) and the reader of both formats
// (train/checkpoint_reader.h), against a sharded state the test builds itself: the full
// tensors of a small model and its optimizer after two real steps are cut into the flat unit
// shards of ZeRO by torch::cat + narrow (independently of ShardLayout::pieces), written by
// W thread-ranks over loopback Gloo and read back at W' ranks, as a full replica, or from a
// state.krab. Every value and optimizer field must land exactly (bitwise) where the layout
// says; every bad file is refused by name with nothing installed on any rank.
#include "train/sharded_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "core/errors.h"
#include "core/fs.h"
#include "core/seal.h"
#include "engine/sharded_state.h"
#include "models/model.h"
#include "support/gloo_ranks.h"
#include "train/checkpoint.h"
#include "train/checkpoint_reader.h"
#include "train/manifest.h"
#include "train/model_export.h"
#include "train/model_file.h"
#include "train/shard_file.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;
using Tensors = std::map<std::string, at::Tensor>;

// fc1 (a unit), fc2 (the root unit), a frozen parameter and a buffer.
struct Net : models::Model {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 7));
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
    scale = register_parameter("scale", torch::ones({2}), /*requires_grad=*/false);
    count = register_buffer("count", torch::zeros({3}, torch::kInt64));
  }
  at::Tensor forward(const at::Tensor& x) override { return fc2(torch::relu(fc1(x))) * scale[0]; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  at::Tensor scale, count;
};

constexpr int64_t kAlign = 4;  // small, so that shard boundaries cut parameters
const std::vector<engine::UnitParams>& units() {
  static const std::vector<engine::UnitParams> u = {
      {"", {{"fc2.weight", {3, 7}}, {"fc2.bias", {3}}}},
      {"fc1", {{"fc1.weight", {7, 5}}, {"fc1.bias", {7}}}}};
  return u;
}

std::unique_ptr<torch::optim::Optimizer> make_opt(const std::string& type,
                                                  std::vector<at::Tensor> params) {
  if (type == "sgd")
    return std::make_unique<torch::optim::SGD>(params,
                                               torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
}

// The reference: a model and optimizer after two steps on fixed data; its full tensors by
// parameter name ("value" and each optimizer field).
struct Reference {
  std::string type;
  std::shared_ptr<Net> net = std::make_shared<Net>();
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::map<std::string, Tensors> full;  // field -> name -> tensor
  int64_t step = 0;

  explicit Reference(const std::string& t) : type(t) {
    torch::manual_seed(7);
    net = std::make_shared<Net>();
    net->count.fill_(5);
    opt = make_opt(type, net->parameters());
    for (int i = 0; i < 2; ++i) {
      opt->zero_grad();
      net->forward(torch::randn({4, 5})).square().mean().backward();
      opt->step();
    }
    for (const auto& item : net->named_parameters()) {
      full["value"][item.key()] = item.value().detach().clone();
      const auto it = opt->state().find(c10::guts::to_string(item.value().unsafeGetTensorImpl()));
      if (it == opt->state().end()) continue;
      if (type == "sgd") {
        full["momentum_buffer"][item.key()] =
            static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().clone();
      } else {
        auto& st = static_cast<torch::optim::AdamParamState&>(*it->second);
        full["exp_avg"][item.key()] = st.exp_avg().clone();
        full["exp_avg_sq"][item.key()] = st.exp_avg_sq().clone();
        step = st.step();
      }
    }
  }
  CheckpointMeta meta(int64_t at) const { return {at, "net", model_signature(*net), 64, 1}; }
  std::vector<std::string> fields() const {
    return type == "sgd" ? std::vector<std::string>{"momentum_buffer"}
                         : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
  }
};

// Unit u's flat of `field`: its parameters flattened end to end, zero-padded to `padded`.
at::Tensor unit_flat(const Tensors& t, int u, int64_t padded) {
  std::vector<at::Tensor> parts;
  for (const auto& p : units()[u].params) parts.push_back(t.at(p.name).reshape(-1));
  at::Tensor flat = torch::cat(parts);
  return torch::cat({flat, torch::zeros({padded - flat.numel()})});
}

// One rank's sharded state: values and optimizer state cut from the reference (or zeros /
// no optimizer state for a restore target), plus a model holding frozen parameter and buffer.
struct Rank {
  engine::ShardLayout layout;
  std::shared_ptr<Net> net = std::make_shared<Net>();
  engine::ShardedState sharded;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
  int rank = 0, world = 1;

  Rank(const Reference& ref, int r, int w, bool filled) : rank(r), world(w) {
    layout = engine::plan_layout(units(), w, kAlign);
    sharded.layout = &layout;
    sharded.stage = 2;
    for (int u = 0; u < layout.num_units(); ++u) {
      const int64_t s = layout.shard_numel(u);
      at::Tensor v = filled ? unit_flat(ref.full.at("value"), u, layout.unit(u).padded)
                                  .narrow(0, r * s, s)
                                  .clone()
                            : torch::full({s}, -3.0f);
      sharded.values.push_back(v);
      opts.push_back(make_opt(ref.type, {v}));
      sharded.optimizers.push_back(opts.back().get());
      if (filled) install(ref, u, s, v);
    }
    torch::NoGradGuard g;
    if (filled) {
      net->scale.copy_(ref.full.at("value").at("scale"));
      net->count.copy_(ref.net->count);
    } else {
      net->scale.fill_(-1);
    }
  }
  void install(const Reference& ref, int u, int64_t s, const at::Tensor& v) {
    const auto cut = [&](const std::string& f) {
      return unit_flat(ref.full.at(f), u, layout.unit(u).padded).narrow(0, rank * s, s).clone();
    };
    const std::string id = c10::guts::to_string(v.unsafeGetTensorImpl());
    if (ref.type == "sgd") {
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(cut("momentum_buffer"));
      opts[u]->state()[id] = std::move(st);
    } else {
      auto st = std::make_unique<torch::optim::AdamParamState>();
      st->step(ref.step);
      st->exp_avg(cut("exp_avg"));
      st->exp_avg_sq(cut("exp_avg_sq"));
      opts[u]->state()[id] = std::move(st);
    }
  }
  engine::TrainState state() { return {net.get(), nullptr, rank, world, &sharded}; }

  // Asserts this rank holds exactly the reference's elements.
  void expect_equals(const Reference& ref) const {
    for (int u = 0; u < layout.num_units(); ++u) {
      const int64_t s = layout.shard_numel(u);
      const auto want = [&](const std::string& f) {
        return unit_flat(ref.full.at(f), u, layout.unit(u).padded).narrow(0, rank * s, s);
      };
      EXPECT_TRUE(torch::equal(sharded.values[u], want("value")))
          << "rank " << rank << " unit " << u;
      const auto it = opts[u]->state().find(
          c10::guts::to_string(opts[u]->param_groups()[0].params()[0].unsafeGetTensorImpl()));
      ASSERT_NE(it, opts[u]->state().end()) << "rank " << rank << " unit " << u;
      if (ref.type == "sgd") {
        auto& st = static_cast<torch::optim::SGDParamState&>(*it->second);
        EXPECT_TRUE(torch::equal(st.momentum_buffer(), want("momentum_buffer")));
      } else {
        auto& st = static_cast<torch::optim::AdamParamState&>(*it->second);
        EXPECT_EQ(st.step(), ref.step);
        EXPECT_TRUE(torch::equal(st.exp_avg(), want("exp_avg")));
        EXPECT_TRUE(torch::equal(st.exp_avg_sq(), want("exp_avg_sq")));
      }
    }
    EXPECT_TRUE(torch::equal(net->scale, ref.full.at("value").at("scale")));
    EXPECT_TRUE(torch::equal(net->count, ref.net->count));
  }
  bool untouched() const {
    for (const auto& v : sharded.values)
      if (!torch::all(v == -3.0f).item<bool>()) return false;
    for (const auto& o : opts)
      if (!o->state().empty()) return false;
    return torch::all(net->scale == -1).item<bool>();
  }
};

struct RunDir {
  fs::path path;
  explicit RunDir(const std::string& tag = "run")
      : path(fs::temp_directory_path() /
             ("krab-sharded-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" + tag)) {
    fs::remove_all(path);
  }
  ~RunDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
  std::string step(int64_t s) const { return (path / step_dir_name(s)).string(); }
};

void write_sharded(const Reference& ref, const RunDir& dir, int world, int64_t step,
                   const CheckpointSeal& seal = {}) {
  testing::run_gloo_ranks(world, [&](int r, comm::Communicator& comm) {
    Rank rank(ref, r, world, true);
    const std::string path =
        save_sharded_checkpoint(comm, dir.str(), ref.meta(step), rank.state(), seal, 5);
    EXPECT_EQ(path.empty(), r != 0);
  });
}

// Restores `step_dir` at `world` ranks; returns each rank's error ("" = restored and equal).
std::vector<std::string> read_sharded(const Reference& ref, const std::string& step_dir, int world,
                                      const CheckpointSeal& seal = {}) {
  std::vector<std::string> errors(world);
  testing::run_gloo_ranks(world, [&](int r, comm::Communicator& comm) {
    Rank rank(ref, r, world, false);
    try {
      const CheckpointMeta m = restore_checkpoint(&comm, step_dir, seal, ref.meta(0), rank.state());
      EXPECT_EQ(m.signature, ref.meta(0).signature);
      rank.expect_equals(ref);
    } catch (const CorruptData& e) {
      errors[r] = e.what();
      EXPECT_TRUE(rank.untouched()) << "rank " << r << " changed before the refusal";
    }
  });
  return errors;
}

TEST(ShardedCheckpoint, RoundTripsBitIdenticalAtTheSameWorldSize) {
  for (const std::string type : {"adam", "sgd"})
    for (const int world : {2, 4}) {
      SCOPED_TRACE(type + " W=" + std::to_string(world));
      const Reference ref(type);
      RunDir dir;
      write_sharded(ref, dir, world, 5);
      EXPECT_EQ(*latest_step_dir(dir.str()), dir.step(5));
      for (int r = 0; r < world; ++r) EXPECT_TRUE(fs::exists(shard_path(dir.step(5), r, world)));
      for (const auto& e : read_sharded(ref, dir.step(5), world)) EXPECT_EQ(e, "");
    }
}

TEST(ShardedCheckpoint, ReshardsFourToTwoAndTwoToThree) {
  for (const std::string type : {"adam", "sgd"}) {
    SCOPED_TRACE(type);
    const Reference ref(type);
    RunDir dir;
    write_sharded(ref, dir, 4, 5);
    for (const auto& e : read_sharded(ref, dir.step(5), 2)) EXPECT_EQ(e, "");
    write_sharded(ref, dir, 2, 6);
    for (const auto& e : read_sharded(ref, dir.step(6), 3)) EXPECT_EQ(e, "");
  }
}

// At 8 ranks the root unit (24 elements, padded to 32) leaves ranks 6 and 7 only padding:
// they get zeros and still the unit's optimizer state (Adam's step count), as the engine's
// optimizer over an all-padding shard has after a step.
TEST(ShardedCheckpoint, ARankWhoseShardIsAllPaddingGetsZerosAndTheUnitsState) {
  const Reference ref("adam");
  RunDir dir;
  write_sharded(ref, dir, 4, 5);
  ASSERT_EQ(engine::plan_layout(units(), 8, kAlign)
                .pieces(0, engine::plan_layout(units(), 8, kAlign).shard(0, 7))
                .size(),
            0u);
  for (const auto& e : read_sharded(ref, dir.step(5), 8)) EXPECT_EQ(e, "");
}

// A stage-0 replica reads a sharded checkpoint whole: every parameter and optimizer field of
// the reference, from whichever shards hold its pieces.
TEST(ShardedCheckpoint, ShardedRestoresIntoAFullReplica) {
  for (const std::string type : {"adam", "sgd"}) {
    SCOPED_TRACE(type);
    const Reference ref(type);
    RunDir dir;
    write_sharded(ref, dir, 3, 5);
    auto net = std::make_shared<Net>();
    {
      torch::NoGradGuard g;
      for (auto& p : net->parameters()) p.fill_(-3);
    }
    auto opt = make_opt(type, net->parameters());
    const CheckpointMeta m = restore_checkpoint(nullptr, dir.step(5), {}, ref.meta(0),
                                                {net.get(), opt.get(), 0, 1, nullptr});
    EXPECT_EQ(m.step, 5);
    for (const auto& item : net->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), ref.full.at("value").at(item.key()))) << item.key();
      const auto it = opt->state().find(c10::guts::to_string(item.value().unsafeGetTensorImpl()));
      ASSERT_EQ(it != opt->state().end(), item.key() != "scale") << item.key();
      if (it == opt->state().end()) continue;
      for (const std::string& f : ref.fields()) {
        const at::Tensor got =
            type == "sgd" ? static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer()
            : f == "exp_avg" ? static_cast<torch::optim::AdamParamState&>(*it->second).exp_avg()
                             : static_cast<torch::optim::AdamParamState&>(*it->second).exp_avg_sq();
        EXPECT_TRUE(torch::equal(got, ref.full.at(f).at(item.key()))) << item.key() << " " << f;
      }
      if (type == "adam")
        EXPECT_EQ(static_cast<torch::optim::AdamParamState&>(*it->second).step(), ref.step);
    }
    EXPECT_TRUE(torch::equal(net->count, ref.net->count));
  }
}

// A state.krab (stage 0) read by a sharded engine at 3 ranks: each rank's ranges of it.
TEST(ShardedCheckpoint, AFullCheckpointRestoresIntoShards) {
  for (const std::string type : {"adam", "sgd"}) {
    SCOPED_TRACE(type);
    const Reference ref(type);
    RunDir dir;
    save_checkpoint(dir.str(), encode_checkpoint(ref.meta(5), *ref.net, *ref.opt), 5, 2);
    for (const auto& e : read_sharded(ref, dir.step(5), 3)) EXPECT_EQ(e, "");
  }
}

// --- Bad input ---------------------------------------------------------------------------------

// Rewrites the manifest of `step_dir` through `edit` (re-sealed with `seal`): what whoever
// holds the key, or anyone for an unsealed run, can do.
void patch_manifest(const std::string& step_dir, const CheckpointSeal& seal,
                    const std::function<void(Manifest&)>& edit) {
  const std::string path = manifest_path(step_dir);
  Manifest m =
      read_manifest(parse_checkpoint(read_checkpoint_file(path, seal.key, seal.job), path));
  edit(m);
  core::RecordWriter rec;
  write_manifest(m, rec);
  core::write_file_atomic(path, core::seal(frame_checkpoint(rec.bytes()), seal.key, seal.job));
}

ShardDigest digest_of(const std::string& path) {
  const std::string bytes = core::read_file(path);
  return {bytes.size(), core::sha256_hex(bytes.data(), bytes.size())};
}

// Each damage to shard 1 of 2 is refused on both ranks (rank 0 does not read shard 1 itself:
// it learns of the failure from the agreement), naming the shard, with nothing installed; the
// previous checkpoint stays `latest`'s target untouched.
TEST(ShardedCheckpoint, ABadShardIsRefusedByNameOnEveryRankAndNothingIsInstalled) {
  const Reference ref("adam");
  const std::string shard1 = "shard-00001-of-00002.krab";
  const std::vector<std::pair<std::string, std::function<void(const RunDir&)>>> damages = {
      {"is missing", [&](const RunDir& d) { fs::remove(shard_path(d.step(5), 1, 2)); }},
      {"truncated",
       [&](const RunDir& d) {
         fs::resize_file(shard_path(d.step(5), 1, 2),
                         fs::file_size(shard_path(d.step(5), 1, 2)) - 9);
       }},
      {"SHA-256",
       [&](const RunDir& d) {
         std::fstream f(shard_path(d.step(5), 1, 2),
                        std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(100);
         f.put('\x5a');
       }},
      // Another checkpoint's shard 1, its digest patched into the manifest: its id gives it away.
      {"belongs to checkpoint",
       [&](const RunDir& d) {
         fs::copy_file(shard_path(d.step(3), 1, 2), shard_path(d.step(5), 1, 2),
                       fs::copy_options::overwrite_existing);
         patch_manifest(d.step(5), {},
                        [&](Manifest& m) { m.shards[1] = digest_of(shard_path(d.step(5), 1, 2)); });
       }},
  };
  for (const auto& [why, damage] : damages) {
    SCOPED_TRACE(why);
    RunDir dir;
    write_sharded(ref, dir, 2, 3);
    write_sharded(ref, dir, 2, 5);
    damage(dir);
    const auto errors = read_sharded(ref, dir.step(5), 2);
    for (const std::string& e : errors) {
      EXPECT_NE(e.find(shard1), std::string::npos) << e;
      EXPECT_NE(e.find(why), std::string::npos) << e;
    }
    EXPECT_NE(errors[0].find("rank 1"), std::string::npos) << errors[0];
    for (const auto& e : read_sharded(ref, dir.step(3), 2)) EXPECT_EQ(e, "");
  }
}

// Sealed runs: a shard sealed for another run (same key, another run directory), even with the
// manifest re-sealed to name its digest, fails its own seal; the manifest read for another job
// fails first, by name.
TEST(ShardedCheckpoint, ASealedShardFromAnotherRunFailsItsSeal) {
  const Reference ref("sgd");
  const std::string key(32, 'k');
  RunDir dir, other("other");
  const CheckpointSeal mine{key, checkpoint_job(dir.str(), ref.meta(0).signature)};
  const CheckpointSeal theirs{key, checkpoint_job(other.str(), ref.meta(0).signature)};
  write_sharded(ref, dir, 2, 5, mine);
  write_sharded(ref, other, 2, 5, theirs);
  const auto wrong_job = read_sharded(ref, dir.step(5), 2, theirs);
  EXPECT_NE(wrong_job[1].find("manifest.krab' fails its seal"), std::string::npos) << wrong_job[1];
  fs::copy_file(shard_path(other.step(5), 1, 2), shard_path(dir.step(5), 1, 2),
                fs::copy_options::overwrite_existing);
  patch_manifest(dir.step(5), mine,
                 [&](Manifest& m) { m.shards[1] = digest_of(shard_path(dir.step(5), 1, 2)); });
  for (const auto& e : read_sharded(ref, dir.step(5), 2, mine))
    EXPECT_NE(e.find("shard-00001-of-00002.krab' fails its seal"), std::string::npos) << e;
}

// One rank cannot write its shard (a directory stands where the file goes): every rank throws
// naming that rank and file, `latest` still names the previous checkpoint, which restores.
TEST(ShardedCheckpoint, AWriteFailureOnOneRankLeavesThePreviousCheckpointInForce) {
  const Reference ref("adam");
  RunDir dir;
  write_sharded(ref, dir, 2, 3);
  fs::create_directories(fs::path(shard_path(dir.step(5), 1, 2)) / "x");
  std::vector<std::string> errors(2);
  testing::run_gloo_ranks(2, [&](int r, comm::Communicator& comm) {
    Rank rank(ref, r, 2, true);
    try {
      save_sharded_checkpoint(comm, dir.str(), ref.meta(5), rank.state(), {}, 5);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("shard-00001-of-00002.krab"), std::string::npos) << e;
  EXPECT_NE(errors[0].find("failed on rank 1"), std::string::npos) << errors[0];
  EXPECT_EQ(*latest_step_dir(dir.str()), dir.step(3));
  EXPECT_FALSE(fs::exists(manifest_path(dir.step(5))));
  for (const auto& e : read_sharded(ref, *latest_step_dir(dir.str()), 2)) EXPECT_EQ(e, "");
}

// `krab export`'s model.pt from a sharded checkpoint (W=3) and from a state.krab: the
// reference model's parameters and buffers, exactly, under their names.
TEST(ShardedCheckpoint, ExportWritesTheFullModelFromEitherFormat) {
  const Reference ref("adam");
  RunDir sharded("sharded"), full("full");
  write_sharded(ref, sharded, 3, 5);
  save_checkpoint(full.str(), encode_checkpoint(ref.meta(5), *ref.net, *ref.opt), 5, 2);
  for (const RunDir* dir : {&sharded, &full}) {
    const std::string out = export_model({dir->str(), std::nullopt, "", ""}).model_pt;
    EXPECT_EQ(out, (dir->path / "model.pt").string());
    const std::string bytes = core::read_file(out);
    const auto dict =
        torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
    EXPECT_EQ(dict.size(), ref.net->named_parameters().size() + ref.net->named_buffers().size());
    for (const auto& item : ref.net->named_parameters())
      EXPECT_TRUE(torch::equal(dict.at(item.key()).toTensor(), item.value())) << item.key();
    EXPECT_TRUE(torch::equal(dict.at("count").toTensor(), ref.net->count));
  }
  try {
    export_model({full.str(), 4, "", ""});
    ADD_FAILURE() << "a missing --step was exported";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--step 4"), std::string::npos) << e.what();
  }
}

// A sealed run exports with its key file (the seal is checked against the run directory and the
// signature the manifest states); without the key, or with another key, it is refused by name.
TEST(ShardedCheckpoint, ASealedRunExportsOnlyWithItsKey) {
  const Reference ref("sgd");
  RunDir dir, keys("keys");
  fs::create_directories(keys.path);
  const std::string key(40, 'k'), key_file = (keys.path / "key").string();
  core::write_file_atomic(key_file, key);
  core::write_file_atomic((keys.path / "other").string(), std::string(40, 'o'));
  write_sharded(ref, dir, 2, 5, {key, checkpoint_job(dir.str(), ref.meta(0).signature)});
  const std::string out = export_model({dir.str(), std::nullopt, "", key_file}).model_pt;
  const std::string bytes = core::read_file(out);
  const auto dict =
      torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  EXPECT_TRUE(
      torch::equal(dict.at("fc1.weight").toTensor(), ref.full.at("value").at("fc1.weight")));
  for (const std::string& k : {std::string(), (keys.path / "other").string()}) {
    try {
      export_model({dir.str(), std::nullopt, "", k});
      ADD_FAILURE() << "exported with key file '" << k << "'";
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find("manifest.krab"), std::string::npos) << e.what();
    }
  }
}

// The fuzz target's seeds (tests/fuzz/corpus/fuzz_shard, mode byte first) are valid files, so
// that fuzzing starts deep inside both readers.
TEST(ShardedCheckpoint, TheFuzzSeedsAreValidShardAndManifestFiles) {
  const fs::path seeds = fs::path(KRAB_SOURCE_DIR) / "tests/fuzz/corpus/fuzz_shard";
  const std::string shard = core::read_file((seeds / "shard-file").string()).substr(1);
  EXPECT_EQ(parse_shard_bytes(shard, "seed", "", "").integer("meta.world"), 2);
  const std::string manifest = core::read_file((seeds / "manifest-file").string()).substr(1);
  const Manifest m = read_manifest(parse_checkpoint(manifest, "seed"));
  EXPECT_EQ(m.layout.world(), 2);
  EXPECT_EQ(m.layout.unit(0).padded, 16);
}

// The streamed model.pt holds what torch::pickle_save's holds, for every dtype a model or its
// buffers use, scalars, empty and non-contiguous tensors included; both load back with
// torch::pickle_load to the same names and bits.
TEST(TorchSaveWriter, WritesWhatPickleSaveWritesTensorByTensor) {
  torch::manual_seed(3);
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"fc.weight", torch::randn({3, 4})},
      {"fc.weight.t", torch::randn({4, 3}).t()},  // not contiguous
      {"scalar", torch::tensor(2.5)},
      {"empty", torch::zeros({0, 3})},
      {"steps", torch::arange(5, torch::kInt64)},
      {"half", torch::randn({6}).to(torch::kHalf)},
      {"bf16", torch::randn({2, 2}).to(torch::kBFloat16)},
      {"mask", torch::tensor({true, false, true})},
      {"bytes", torch::arange(4, torch::kUInt8)},
  };
  std::string streamed;
  {
    core::StringSink sink(streamed);
    TorchSaveWriter out(sink);
    for (const auto& [name, t] : tensors) out.add(name, t);
    out.finish();
  }
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t);
  const std::vector<char> whole = torch::pickle_save(c10::IValue(dict));
  const auto a =
      torch::pickle_load(std::vector<char>(streamed.begin(), streamed.end())).toGenericDict();
  const auto b = torch::pickle_load(whole).toGenericDict();
  ASSERT_EQ(a.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor x = a.at(name).toTensor(), y = b.at(name).toTensor();
    EXPECT_EQ(x.scalar_type(), y.scalar_type()) << name;
    EXPECT_EQ(x.sizes(), y.sizes()) << name;
    EXPECT_TRUE(torch::equal(x, y)) << name;
  }
}

// A sink that fails (a full disk) fails add() or finish() with the sink's own error, and an
// unfinished writer is destroyed without writing (no exception out of a destructor).
TEST(TorchSaveWriter, ASinkFailureComesOutAsTheSinksError) {
  struct Full : core::ByteSink {
    size_t room = 200;
    void write(const char*, size_t n) override {
      if (n > room) throw Error("model.pt: No space left on device");
      room -= n;
    }
  } sink;
  try {
    TorchSaveWriter out(sink);
    out.add("w", torch::zeros({1000}));
    out.finish();
    ADD_FAILURE() << "the full sink took the file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace krab::train
