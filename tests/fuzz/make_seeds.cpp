// Writes the seed corpus of every fuzz target, corpus/<target>/, with krab's own encoders
// (protobuf messages are spelled out by hand: the generated code belongs to the transports).
// Usage: fuzz_make_seeds SOURCE_DIR [TARGET...] — writes SOURCE_DIR/tests/fuzz/corpus/ (only
// the named targets' seeds when targets are given, so that a format change rewrites only its
// own corpus). Deterministic
// except where the format holds random bytes (keys, nonces, the checkpoint's RNG state).
#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "core/config.h"
#include "core/fs.h"
#include "federated/secagg.h"
#include "federated/server_state.h"
#include "train/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using namespace std::string_literals;
using Bytes = std::string;

fs::path g_out;
std::set<std::string> g_only;  // empty: every target

void seed(const std::string& target, const std::string& name, const Bytes& bytes) {
  if (!g_only.empty() && g_only.count(target) == 0) return;
  const fs::path dir = g_out / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

Bytes str(const std::vector<uint8_t>& v) { return Bytes(v.begin(), v.end()); }
Bytes floats(std::initializer_list<float> v) {
  return Bytes(reinterpret_cast<const char*>(v.begin()), v.size() * 4);
}

// Minimal protobuf writer: varints, doubles, length-delimited fields.
struct Proto {
  Bytes b;
  void varint(uint64_t v) {
    while (v >= 0x80) b += static_cast<char>((v & 0x7f) | 0x80), v >>= 7;
    b += static_cast<char>(v);
  }
  Proto& u(int field, uint64_t v) {
    varint(uint64_t(field) << 3), varint(v);
    return *this;
  }
  Proto& d(int field, double v) {
    varint((uint64_t(field) << 3) | 1);
    b.append(reinterpret_cast<const char*>(&v), 8);
    return *this;
  }
  Proto& s(int field, const Bytes& v) {
    varint((uint64_t(field) << 3) | 2), varint(v.size());
    b += v;
    return *this;
  }
};

void config_seeds(const fs::path& source) {
  for (const auto& e : fs::directory_iterator(source / "examples"))
    if (e.path().extension() == ".yaml")
      seed("fuzz_config", e.path().filename().string(), krab::core::read_file(e.path().string()));
  seed("fuzz_config", "defaults.yaml", krab::core::Config::defaults().to_yaml());
  seed("fuzz_config", "overrides",
       "name: x\ntrain:\n  epochs: 2\n  optimizer: {name: sgd, lr: 0.05}\n"
       "\0train.epochs=3\0model.name = mlp\0train.optimizer.lr=1e-3"s);
  seed("fuzz_config", "dotted", "train.optimizer.lr: 0.1\ndata: {batch_size: 32}\n");
  seed("fuzz_config", "empty", "");
}

void checkpoint_seeds() {
  torch::nn::Linear model(torch::nn::LinearOptions(3, 2));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  model(torch::ones({1, 3})).sum().backward();
  opt.step();
  krab::train::CheckpointMeta m;
  m.step = 7;
  m.model_name = "linear";
  m.signature = krab::train::model_signature(*model);
  m.global_batch = 8;
  const Bytes file = krab::train::encode_checkpoint(m, *model, opt);
  seed("fuzz_checkpoint", "whole-file", "\x01" + file);
  seed("fuzz_checkpoint", "payload", Bytes(1, '\0') + file.substr(24));
  m.global_batch = 16;
  seed("fuzz_checkpoint", "other-batch",
       Bytes(1, '\0') + krab::train::encode_checkpoint(m, *model, opt).substr(24));

  seed("fuzz_latest", "step", "step-00000001\n");
  seed("fuzz_latest", "bare", "step-00000001");
  seed("fuzz_latest", "crlf", "step-00000001\r\n");
  seed("fuzz_latest", "missing", "step-00000002\n");
  seed("fuzz_latest", "nul", Bytes("step-00000001\0garbage", 21));
  seed("fuzz_latest", "escape", "../step-00000001\n");
}

// fuzz_tensor_file: the first byte 1 means a whole file, 0 the data.pkl of an archive the target
// writes around it (storages "0" to "3", 64 bytes each: the tensors below fit in them).
// torch::pickle_save writes the archive Python's torch.save writes; Python's own pickle (which
// adds an OrderedDict of backward hooks to each tensor) is one more seed, copied from
// torch.save({"x": torch.zeros(3, 4), "y": torch.zeros(3, dtype=torch.long)}) by torch 1.13.
void tensor_file_seeds() {
  auto file = [](const at::Tensor& x, const at::Tensor& y) {
    c10::Dict<std::string, at::Tensor> xy;
    xy.insert("x", x);
    xy.insert("y", y);
    const std::vector<char> bytes = torch::pickle_save(c10::IValue(xy));
    return Bytes(bytes.begin(), bytes.end());
  };
  auto pickle_of = [](const Bytes& archive) {
    std::istringstream in(archive);
    caffe2::serialize::PyTorchStreamReader reader(&in);
    auto [data, size] = reader.getRecord("data.pkl");
    return Bytes(static_cast<const char*>(data.get()), size);
  };
  const Bytes floats_longs = file(torch::arange(12, torch::kFloat32).view({3, 4}),
                                  torch::tensor({0, 2, 1}, torch::kInt64));
  const Bytes bytes_ints =
      file(torch::arange(6, torch::kUInt8).view({3, 2}), torch::tensor({1, 0, 3}, torch::kInt32));
  const Bytes float_y =
      file(torch::ones({2, 3}, torch::kFloat64), torch::arange(4, torch::kFloat32).view({2, 2}));
  seed("fuzz_tensor_file", "floats-longs", "\1" + floats_longs);
  seed("fuzz_tensor_file", "bytes-ints", "\1" + bytes_ints);
  seed("fuzz_tensor_file", "float-y", "\1" + float_y);
  seed("fuzz_tensor_file", "pickle-floats-longs", "\0"s + pickle_of(floats_longs));
  seed("fuzz_tensor_file", "pickle-float-y", "\0"s + pickle_of(float_y));
  static const char python[] =
      "\200\002}q\000(X\001\000\000\000xq\001ctorch._utils\012_rebuild_tensor_v2\012q\002((X"
      "\007\000\000\000storageq\003ctorch\012FloatStorage\012q\004X\001\000\000\0000q\005X"
      "\003\000\000\000cpuq\006K\014tq\007QK\000K\003K\004\206q\010K\004K\001\206q\011\211cco"
      "llections\012OrderedDict\012q\012)Rq\013tq\014Rq\015X\001\000\000\000yq\016h\002((h"
      "\003ctorch\012LongStorage\012q\017X\001\000\000\0001q\020h\006K\003tq\021QK\000K\003"
      "\205q\022K\001\205q\023\211h\012)Rq\024tq\025Rq\026u.";
  seed("fuzz_tensor_file", "pickle-python", "\0"s + Bytes(python, sizeof(python) - 1));
}

Bytes gzip(const Bytes& plain) {
  const fs::path tmp = fs::temp_directory_path() / "krab-seed.gz";
  gzFile f = gzopen(tmp.c_str(), "wb");
  gzwrite(f, plain.data(), static_cast<unsigned>(plain.size()));
  gzclose(f);
  const Bytes out = krab::core::read_file(tmp.string());
  fs::remove(tmp);
  return out;
}

void data_seeds() {
  const Bytes labels = Bytes("\0\0\x08\x01\0\0\0\x05", 8) + Bytes("\x01\x02\x03\x04\x09", 5);
  const Bytes images = Bytes("\0\0\x08\x03\0\0\0\x02\0\0\0\x02\0\0\0\x02", 16) +
                       Bytes("\x00\x10\x20\x30\x40\x50\x60\xff", 8);
  seed("fuzz_idx", "labels", labels);
  seed("fuzz_idx", "images", images);
  seed("fuzz_idx", "labels.gz", gzip(labels));
  seed("fuzz_idx", "images.gz", gzip(images));

  seed("fuzz_csv", "basic", "a,b,label\n1,2,0\n3,4,1\n5,6,0\n7.5,-1e3,1\n");
  seed("fuzz_csv", "spaces-crlf", " x , label ,y\r\n0.5, 1 ,2\r\n\r\n1.5,0,-3\r\n2,2,4\r\n");
  seed("fuzz_csv", "label-first", "label,x\n0,1\n1,2\n2,3\n3,4\n");

  seed("fuzz_text", "short", "\x03hello world, this is a text file.\n");
  seed("fuzz_text", "split",
       "\x15The quick brown fox jumps over the lazy dog. \xc3\xa9\xe2\x82\xac\n");
}

void secagg_seeds() {
  using namespace krab::federated::secagg;
  Config cfg;
  cfg.round = 42;
  cfg.vector_length = 4;
  cfg.threshold = 2;
  cfg.clients = 3;
  cfg.fp = FixedPoint::for_clients(1.0, 3);
  std::map<uint64_t, Client> clients;
  for (uint64_t id : {3, 10, 17}) clients.emplace(id, Client(id, cfg));
  Server s(cfg);
  const auto put = [](char kind, const std::string& name, const std::vector<uint8_t>& m) {
    seed("fuzz_secagg", name, Bytes(1, kind) + str(m));
  };
  for (auto& [id, c] : clients) {
    const AdvertiseKeys a = c.advertise_keys();
    if (id == 3) put(0, "advertise", a.to_bytes());
    s.receive(a);
  }
  const Roster roster = s.roster();
  put(1, "roster", roster.to_bytes());
  for (auto& [id, c] : clients) {
    const ShareKeys k = c.share_keys(roster);
    if (id == 3) put(2, "share-keys", k.to_bytes());
    s.receive(k);
  }
  std::map<uint64_t, IncomingShares> incoming;
  for (auto& [id, c] : clients) incoming[id] = s.shares_for(id);
  put(3, "incoming", incoming[3].to_bytes());
  // Client 17 drops out after sharing keys, so the request has a dropped id.
  for (auto& [id, c] : clients) {
    if (id == 17) continue;
    const MaskedInput y = c.masked_input(incoming[id], std::vector<float>{0.5f, -0.25f, 0, 1});
    if (id == 3) put(4, "masked", y.to_bytes());
    s.receive(y);
  }
  const UnmaskRequest request = s.unmask_request();
  put(5, "unmask-request", request.to_bytes());
  const UnmaskResponse response = clients.at(10).unmask(request);
  put(6, "unmask-response", response.to_bytes());
  put(7, "share", response.self_mask_shares.at(0).share.to_bytes());
}

class Constant : public krab::federated::Participant {
 public:
  explicit Constant(std::string id) : id_(std::move(id)) {}
  const std::string& id() const override { return id_; }
  krab::federated::FitReply fit(const krab::federated::FitInstruction&) override {
    krab::federated::FitReply r;
    r.update = torch::tensor({0.5f, -1.f});
    r.num_examples = 3;
    r.mean_loss = 0.25;
    return r;
  }
  std::vector<uint8_t> secagg(const krab::federated::SecAggRequest&) override { return {}; }

 private:
  std::string id_;
};

void server_state_seeds() {
  using namespace krab::federated;
  FederatedOptions o;
  o.fraction = 1.0;
  o.min_clients = 1;
  o.strategy = "fedadam";
  RoundRunner runner(o, torch::zeros({2}), false);
  Constant a("a"), b("b");
  runner.run_round({&a, &b});
  runner.run_round({&a, &b});
  const fs::path path = fs::temp_directory_path() / "krab-seed-fl-state.krab";
  save_server_state(path.string(), runner, "sig");
  const Bytes file = krab::core::read_file(path.string());
  fs::remove(path);
  seed("fuzz_server_state", "whole-file", "\x01" + file);
  seed("fuzz_server_state", "payload", Bytes(1, '\0') + file.substr(20));
}

void payload_seeds() {
  const Bytes g = floats({0.5f, -1.f, 2.f, 0.f});
  // fl.proto Task and TaskResult (field numbers from there).
  seed("fuzz_fl_payload", "task-fit",
       Bytes(1, '\0') + Proto()
                            .u(1, 1)
                            .u(2, 7)
                            .u(3, 2)
                            .s(4, g)
                            .d(5, 0.01)
                            .d(6, 1.0)
                            .u(8, 1)
                            .u(9, 3)
                            .u(10, 2)
                            .u(11, 3)
                            .d(12, 4.0)
                            .b);
  seed("fuzz_fl_payload", "task-secagg",
       Bytes(1, '\0') + Proto().u(1, 2).u(2, 8).u(13, 2).d(14, 0.5).s(15, "SA1I....").b);
  seed("fuzz_fl_payload", "task-wait", Bytes(1, '\0'));
  seed("fuzz_fl_payload", "task-done", Bytes(1, '\0') + Proto().u(1, 3).b);
  seed("fuzz_fl_payload", "result-update",
       Bytes(1, '\1') + Proto().u(1, 7).s(3, g).u(4, 10).d(5, 0.5).b);
  seed("fuzz_fl_payload", "result-secure",
       Bytes(1, '\2') + Proto().u(1, 7).u(4, 10).d(5, 0.5).s(6, "SA0K").b);

  // ps.proto StepRequest sessions (1-byte length before each) and a FinishReply.
  const auto session = [](const std::vector<Bytes>& requests) {
    Bytes out;
    for (const Bytes& r : requests) out += static_cast<char>(r.size()) + r;
    return out;
  };
  const Bytes report =
      Proto().u(1, 1).d(2, 1.5).d(3, 0.1).s(4, Proto().u(1, 1).d(3, 0.8).b).d(5, 0.3).b;
  const std::vector<Bytes> steps = {
      Proto().u(1, 0).u(2, 0).b,                       // worker 0 pulls
      Proto().u(1, 1).u(2, 0).b,                       // worker 1 pulls
      Proto().u(1, 0).u(2, 1).s(3, g).u(4, 0).b,       // worker 0 pushes step 0
      Proto().u(1, 1).u(2, 1).s(3, g).u(4, 0).b,       // worker 1 pushes step 0
      Proto().u(1, 0).u(2, 2).s(3, g).u(4, 1).b,       // worker 0 pushes step 1
      Proto().u(1, 0).u(2, 2).u(5, 1).s(6, report).b,  // worker 0 leaves
  };
  for (char mode : {0, 2, 4, 8 | 16})
    seed("fuzz_ps_payload", "session-" + std::to_string(int(mode)),
         Bytes(1, mode) + session(steps));
  seed("fuzz_ps_payload", "finish",
       Bytes(1, '\1') + Proto().s(1, g).u(2, 1000).u(3, 2000).u(4, 5).b);
}

}  // namespace

// fuzz_generation: records as the keeper writes them (elastic/generation.h's text form), spelled
// out so that this program need not link the elastic layer.
void generation_seeds() {
  const Bytes head =
      "generation 3\ndecided_step 41\nworkers 2\nmember 0 0 0 4121 0.0.0\n"
      "member 1 1 0 977 1.0.1\n";
  seed("fuzz_generation", "abort",
       head +
           "store file /run/g3.store\nkind abort\nreason death\n"
           "lost 0.1.0 killed by signal 9\ndecided_at 1765000000.125\nstate run\n");
  seed("fuzz_generation", "proposal",
       head +
           "store 10.0.0.7:29400\nkind proposal\nreason join\n"
           "decided_at 1765000000.007\nstate run\n");
  seed("fuzz_generation", "restore",
       head +
           "store [::1]:29400\nkind abort\nreason death, leave\nlost 0.1.0 left\n"
           "lost 0.2.0 exited with status 1\ndecided_at 1.000\nstate restore /r/step-00000040\n");
  seed("fuzz_generation", "waiting",
       "generation 9\ndecided_step 0\nworkers 0\nstore file /g9\nkind abort\nreason lease\n"
       "lost 2.0.0 lease of node 2 expired\ndecided_at 0.000\nstate waiting\n");
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: fuzz_make_seeds SOURCE_DIR [TARGET...]\n";
    return 2;
  }
  const fs::path source = argv[1];
  g_only.insert(argv + 2, argv + argc);
  g_out = source / "tests" / "fuzz" / "corpus";
  config_seeds(source);
  checkpoint_seeds();
  data_seeds();
  tensor_file_seeds();
  secagg_seeds();
  server_state_seeds();
  payload_seeds();
  generation_seeds();
  std::cout << "seeds written under " << g_out << "\n";
  return 0;
}
