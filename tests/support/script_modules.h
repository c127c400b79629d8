// Small TorchScript modules for the tests, built in C++ (torch::jit::Module::define) so that
// the tests need no Python: the same kind of file torch.jit.script(m).save() writes, with a
// submodule tree, a BatchNorm and optional training_loss / predict methods.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <string>

namespace krab::test {

class ScriptBuilder {
 public:
  ScriptBuilder() : cu_(std::make_shared<torch::jit::CompilationUnit>()) {}

  // A module of class `cls` with its `training` flag (which jit::Module::train sets).
  torch::jit::Module module(const std::string& cls) {
    torch::jit::Module m(c10::QualifiedName("__torch__." + cls), cu_, /*shouldMangle=*/true);
    m.register_attribute("training", c10::BoolType::get(), true);
    return m;
  }

  // Linear(in, out) as Python's nn.Linear names it: weight [out, in], bias [out].
  torch::jit::Module linear(int64_t in, int64_t out) {
    torch::jit::Module m = module("Linear");
    torch::nn::Linear init(in, out);  // LibTorch's default initialisation
    m.register_parameter("weight", init->weight.detach().clone().requires_grad_(true), false);
    m.register_parameter("bias", init->bias.detach().clone().requires_grad_(true), false);
    m.define(R"(
def forward(self, x):
    return torch.linear(x, self.weight, self.bias)
)");
    return m;
  }

  // BatchNorm1d(n) with Python's parameter and buffer names.
  torch::jit::Module batchnorm(int64_t n) {
    torch::jit::Module m = module("BatchNorm1d");
    m.register_parameter("weight", torch::ones({n}).requires_grad_(true), false);
    m.register_parameter("bias", torch::zeros({n}).requires_grad_(true), false);
    m.register_buffer("running_mean", torch::zeros({n}));
    m.register_buffer("running_var", torch::ones({n}));
    m.register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
    m.define(R"(
def forward(self, x):
    if self.training:
        self.num_batches_tracked.add_(1)
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                            self.training, 0.1, 1e-5, False)
)");
    return m;
  }

  // in -> body.fc Linear(in, hidden) -> bn BatchNorm1d -> relu -> head Linear(hidden, out).
  // `extra` is TorchScript source appended (training_loss, predict, ...).
  torch::jit::Module net(int64_t in, int64_t hidden, int64_t out, const std::string& extra = "") {
    torch::jit::Module body = module("Body");
    body.register_module("fc", linear(in, hidden));
    body.define(R"(
def forward(self, x):
    return self.fc.forward(x)
)");
    torch::jit::Module root = module("Net");
    root.register_module("body", body);
    root.register_module("bn", batchnorm(hidden));
    root.register_module("head", linear(hidden, out));
    root.define(R"(
def forward(self, x):
    x = x.flatten(1)
    return self.head.forward(torch.relu(self.bn.forward(self.body.forward(x))))
)" + extra);
    return root;
  }

  // A module whose only parameter is frozen (requires_grad false).
  torch::jit::Module frozen(int64_t in, int64_t out) {
    torch::jit::Module m = module("Frozen");
    m.register_parameter("weight", torch::randn({out, in}), false);
    m.define(R"(
def forward(self, x):
    return torch.linear(x.flatten(1), self.weight)
)");
    return m;
  }

 private:
  std::shared_ptr<torch::jit::CompilationUnit> cu_;
};

}  // namespace krab::test
