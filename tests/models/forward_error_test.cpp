// models/forward_error.h: the cause of a failure in a model's own code, out of LibTorch's text.
// The interpreter's text puts two tracebacks first, and the serialized code's excerpts hold
// lines at the left margin ("class Body(Module):"); the cause is the line that LibTorch itself
// ends with, whatever comes before it.
#include "models/forward_error.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "models/torchscript.h"
#include "support/script_modules.h"

namespace krab::models {
namespace {

namespace fs = std::filesystem;

// What `run` throws, described.
template <typename F>
LibraryError failure_of(F run) {
  try {
    run();
  } catch (const std::exception& e) {
    return describe_library_error(e);
  }
  ADD_FAILURE() << "nothing was thrown";
  return {};
}

TEST(ForwardError, TheCauseOfAnInterpreterFailureIsItsLastLineWithoutTheTracebacks) {
  // Saved and loaded: the serialized code's excerpts are those of a file.
  const fs::path path =
      fs::temp_directory_path() / ("krab-forward-cause-" + std::to_string(::getpid()) + ".ts");
  test::ScriptBuilder().net(2, 8, 2).save(path.string());  // body.fc is Linear(2, 8)
  torch::jit::Module net = torch::jit::load(path.string());
  fs::remove(path);
  const LibraryError e = failure_of([&] { net.forward({torch::ones({2, 3})}); });
  EXPECT_EQ(e.cause, "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x8)");
  EXPECT_NE(e.details.find("Traceback of TorchScript"), std::string::npos) << e.details;
  EXPECT_NE(e.details.find("\nclass Body(Module):"), std::string::npos) << e.details;
}

TEST(ForwardError, ALibTorchErrorOutsideTheInterpreterLosesItsCxxBacktrace) {
  const LibraryError e = failure_of([] { torch::ones({2, 3}).mm(torch::ones({2, 3})); });
  EXPECT_EQ(e.cause, "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)");
  EXPECT_EQ(e.details.find("frame #"), std::string::npos) << e.details;
}

// A TorchScript model's forward that fails is one line naming the file; the traceback is kept
// aside in details(). (LibTorch's interpreter throws a std::runtime_error, not a c10::Error:
// before, it escaped the model as the whole traceback.)
TEST(ForwardError, ATorchScriptModelsFailingForwardIsOneLineNamingTheFile) {
  const fs::path path =
      fs::temp_directory_path() / ("krab-forward-error-" + std::to_string(::getpid()) + ".ts");
  test::ScriptBuilder().net(2, 8, 2).save(path.string());
  ModelSpec spec;
  spec.name = "torchscript";
  spec.path = path.string();
  const std::shared_ptr<Model> model = make_model(spec);
  fs::remove(path);
  try {
    model->forward(torch::ones({2, 3}));
    ADD_FAILURE() << "the forward ran";
  } catch (const ForwardError& e) {
    EXPECT_EQ(std::string(e.what()),
              "model.path: '" + spec.path +
                  "': forward failed: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x8)");
    EXPECT_NE(e.details().find("Traceback of TorchScript"), std::string::npos);
  }
}

}  // namespace
}  // namespace krab::models
