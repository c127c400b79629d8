#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/errors.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace krab::data {
namespace {

std::string read_bytes(const std::string& path) {
  KRAB_CHECK_ARG(std::filesystem::is_regular_file(path), "text file '", path, "' does not exist");
  std::ifstream in(path, std::ios::binary);
  KRAB_CHECK_ARG(in.good(), "cannot open text file '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(str_cat("reading text file '", path, "' failed"));
  return bytes;
}

}  // namespace

DataSplits load_text(const std::string& path, int64_t context, double test_fraction,
                     const Tokenizer& tokenizer) {
  KRAB_CHECK_ARG(context >= 1, "text context must be >= 1, got ", context);
  KRAB_CHECK_ARG(test_fraction >= 0.0 && test_fraction < 1.0,
                 "test fraction must be in [0, 1), got ", test_fraction);
  const std::vector<int64_t> tokens = tokenizer.encode(read_bytes(path));

  // Windows of context + 1 tokens: the extra token is the last position's target, so inputs
  // and targets of one window are the same tokens shifted by one.
  const int64_t window = context + 1;
  const int64_t windows = static_cast<int64_t>(tokens.size()) / window;
  const char* unit = tokenizer.unit();
  KRAB_CHECK_ARG(windows >= 2, "text file '", path, "' has ", tokens.size(), " ", unit,
                 "; context ", context, " needs at least ", 2 * window,
                 " (two windows of context + 1 ", unit, ")");

  int64_t n_test = 0;
  if (test_fraction > 0.0) {
    n_test = std::llround(static_cast<double>(windows) * test_fraction);
    n_test = std::min(std::max<int64_t>(n_test, 1), windows - 1);
  }
  const int64_t n_train = windows - n_test;

  at::Tensor all =
      torch::from_blob(const_cast<int64_t*>(tokens.data()), {windows, window}, torch::kInt64)
          .clone();
  at::Tensor inputs = all.narrow(1, 0, context);
  at::Tensor targets = all.narrow(1, 1, context);

  DataSplits splits;
  splits.train = {inputs.narrow(0, 0, n_train).contiguous(),
                  targets.narrow(0, 0, n_train).contiguous()};
  if (n_test > 0) {
    splits.test = TensorDataset{inputs.narrow(0, n_train, n_test).contiguous(),
                                targets.narrow(0, n_train, n_test).contiguous()};
  }
  splits.input_shape = {context};
  splits.num_classes = tokenizer.vocab_size();
  splits.language_model = true;
  return splits;
}

DataSplits load_text(const std::string& path, int64_t context, double test_fraction) {
  return load_text(path, context, test_fraction, *byte_tokenizer());
}

}  // namespace krab::data
