// Trains a network defined here, in the user's program, with krab's data-parallel engine: two
// workers (threads of this process, joined by Gloo through a rendezvous store in a private
// directory) each hold a replica, train on their half of every global batch, and average
// gradients through krab's DataParallel. Only krab's public headers are used; no CLI, no job
// file.
//
//   train_own_model [--workers N] [--batch B] [--steps S] [--out FILE]
//
// --batch is per worker (the global batch is N·B). Prints the final loss (the mean over
// workers of the last step's loss) and a checksum of the trained parameters; --out writes them
// as krab's model.pt does (name -> tensor, torch::pickle_save; Python's torch.load reads it).
//
// The data is krab's synthetic classification problem and the batches come from krab's
// global-batch sampler, with the same seed for both, so N workers with batch B reproduce one
// worker with batch N·B (krab's determinism contract) and the job in
// tests/package/cpp_api_job.yaml run by `krab train` (the package test checks both).
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/factory.h"
#include "comm/store.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "models/model.h"
#include "parallel/dp_engine.h"

namespace {

struct Options {
  int workers = 2;
  int64_t batch = 32;  // per worker
  int64_t steps = 20;
  double lr = 0.1;
  uint64_t seed = 7;
  std::string out;  // "" = do not save
};

// The user's network. krab's engines train any krab::models::Model: a torch::nn::Module whose
// forward(x) returns logits; loss() (mean cross-entropy) and correct() have defaults a model
// may override. Its layers happen to be those of krab's built-in `mlp` (the same names in the
// same order, so the same seed draws the same initial weights): that is what lets the test
// compare this program with `krab train` running model.name: mlp.
class TwoHiddenLayerNet : public krab::models::Model {
 public:
  TwoHiddenLayerNet(int64_t in, int64_t hidden, int64_t classes)
      : fc1_(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2_(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3_(register_module("fc3", torch::nn::Linear(hidden, classes))) {}

  at::Tensor forward(const at::Tensor& inputs) override {
    at::Tensor x = torch::relu(fc1_->forward(inputs.flatten(1)));
    x = torch::relu(fc2_->forward(x));
    return fc3_->forward(x);
  }

 private:
  torch::nn::Linear fc1_, fc2_, fc3_;
};

// One worker's training loop: the loop krab's Trainer runs, reduced to what this program needs
// (engine/engine.h describes the calls).
double train_worker(int rank, const Options& o, const krab::comm::Endpoint& rendezvous,
                    std::shared_ptr<krab::models::Model> model, const krab::data::DataSplits& d) {
  krab::comm::WorldInfo world;
  world.rank = rank;
  world.size = o.workers;
  world.rendezvous = rendezvous;
  krab::comm::Options comm_options;
  comm_options.timeout = std::chrono::seconds(60);
  auto group = krab::comm::make_communicator("gloo", world, comm_options);

  krab::parallel::DataParallelEngineOptions engine_options;
  engine_options.total_steps = o.steps;
  engine_options.global_micro_batch = o.batch * o.workers;
  const double lr = o.lr;
  krab::parallel::DataParallelEngine engine(
      model, std::move(group), engine_options, /*hook=*/nullptr,  // plain all-reduce
      [lr](std::vector<at::Tensor> params) {
        return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(lr));
      });

  // Every worker builds the same sampler: the global batch of step s depends only on the seed;
  // the engine's plan says which slice of it this worker computes.
  krab::data::GlobalBatchSampler sampler(d.train.size(), o.batch * o.workers, o.seed);
  double last_loss = 0;
  engine.model().train();
  while (const auto plan = engine.next_step()) {
    engine.before_backward(/*micro=*/0, /*last=*/true);
    auto [x, y] = krab::data::gather(d.train, sampler.slice(plan->step, plan->slice));
    at::Tensor loss = model->loss(model->forward(x), y);
    loss.backward();
    engine.reduce_gradients();
    engine.apply(lr);
    engine.after_step(*plan);
    last_loss = loss.item<double>();
  }
  return last_loss;
}

void save_parameters(const torch::nn::Module& model, const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& item : model.named_parameters()) dict.insert(item.key(), item.value().detach());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f.flush()) throw std::runtime_error("cannot write " + path);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    const auto number = [&] {
      size_t end = 0;
      int64_t n = -1;
      try {
        n = std::stoll(value, &end);
      } catch (const std::exception&) {
      }
      if (end != value.size() || n < 1)
        throw std::invalid_argument(flag + " needs a positive integer, got '" + value + "'");
      return n;
    };
    if (flag == "--workers")
      o.workers = static_cast<int>(number());
    else if (flag == "--batch")
      o.batch = number();
    else if (flag == "--steps")
      o.steps = number();
    else if (flag == "--out")
      o.out = value;
    else
      throw std::invalid_argument("unknown option " + flag);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_own_model: %s\n", e.what());
    return 2;
  }
  torch::set_num_threads(1);  // one intra-op thread per worker, as `krab train` runs them

  // 2048 examples of 16 features in 4 classes, 10% held out; drawn from the seed alone.
  const krab::data::DataSplits d = krab::data::make_synthetic(2048, 16, 4, 0.1, o.seed);
  std::vector<std::shared_ptr<TwoHiddenLayerNet>> replicas;
  for (int r = 0; r < o.workers; ++r) {
    torch::manual_seed(o.seed);  // the engine broadcasts rank 0's weights anyway
    replicas.push_back(std::make_shared<TwoHiddenLayerNet>(d.input_shape[0], 32, d.num_classes));
  }

  // A FileStore in a directory only this user can read: no network port is opened for the
  // rendezvous (comm/store.h). Several machines would use a TCP store on a --rdzv address.
  std::string pattern =
      (std::filesystem::temp_directory_path() / "krab-example-XXXXXX").string();  // $TMPDIR
  char* dir = mkdtemp(pattern.data());
  if (dir == nullptr) {
    std::perror("train_own_model: mkdtemp");
    return 1;
  }
  krab::comm::Endpoint rendezvous;
  rendezvous.host = "127.0.0.1";  // Gloo connects the workers over the loopback interface
  rendezvous.file = std::string(dir) + "/store";
  std::vector<double> losses(o.workers);
  std::vector<std::string> errors(o.workers);
  {
    krab::comm::StoreServer store(rendezvous);
    std::vector<std::thread> workers;
    for (int r = 0; r < o.workers; ++r)
      workers.emplace_back([&, r] {
        try {
          losses[r] = train_worker(r, o, rendezvous, replicas[r], d);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : workers) t.join();
  }
  std::remove(rendezvous.file.c_str());
  rmdir(dir);
  for (int r = 0; r < o.workers; ++r)
    if (!errors[r].empty()) {
      std::fprintf(stderr, "train_own_model: worker %d: %s\n", r, errors[r].c_str());
      return 1;
    }

  double loss = 0, checksum = 0;
  for (double l : losses) loss += l / o.workers;
  for (const auto& p : replicas[0]->parameters()) checksum += p.sum().item<double>();
  std::printf("trained %lld steps on %d workers: final loss %.6f, parameter checksum %.9g\n",
              static_cast<long long>(o.steps), o.workers, loss, checksum);
  if (!o.out.empty()) save_parameters(*replicas[0], o.out);
  return 0;
}
